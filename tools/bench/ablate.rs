//! Ablations: one fast path turned off (or a variant chosen) to measure what it is worth.
//! `leanstream bench --ablate a,b,...` times each beside the configuration it changes;
//! `generate` and `perplexity` run with the CPU ones (`--ablate no-vnni`, say). Each is a
//! value applied to the options an engine boots with ([`KernelSet`], [`CudaOptions`]): no
//! process-wide switch, so configurations timed side by side never share one.

use leanstream::backend::cpu::KernelSet;
use leanstream::engine::any::Backend;
use leanstream::engine::cuda_options::{
    product_tpr_fits, CudaOptions, DependentLaunch, GroupedAttention as GroupedAttentionMode,
    InBlockNorm, PrefillProducts, ProductKernels, ProductRole,
};
use leanstream::kv::KvChoice;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ablation {
    /// CPU, w8a8/w4a8: every weight group dequantized to f32 before the dot product.
    NoDeferredDequant,
    /// CPU, x86: the AVX2 dot product where the CPU has VNNI.
    NoVnni,
    /// CPU, x86: the eight-row kernels where the CPU has AVX-512 VNNI.
    NoAvx512,
    /// CPU, x86: decode's one-pass kernels prefetch in software (the default on Intel only).
    CpuPrefetch,
    /// CPU, x86: they leave prefetching to the hardware (the default but on Intel).
    NoCpuPrefetch,
    /// CPU: K-quant rows read their input with a scale per 32 values, not one per 256.
    KBlockScales,
    /// CPU: attention a task a query head, not several heads of a KV head a task.
    CpuPerHeadAttention,
    /// CPU: the KV cache in f32 (rather than f16, or int8 at w8a8/w4a8).
    CpuF32Kv,
    /// CUDA: every kernel launched, without the per-token graph.
    NoGraph,
    /// CUDA: every product kernel narrow.
    Narrow,
    /// CUDA: every product kernel wide.
    Wide,
    /// CUDA: the residual's norm made once by the last block of the product before.
    NormTail,
    /// CUDA: every product that reads the normed residual norms it in each block.
    NormInBlock,
    /// CUDA: weights pulled into L2 during attention (off by default).
    AttentionPrefetch,
    /// CUDA (sm_90): no product pulls the next product's weights into L2.
    NoPrefetchAhead,
    /// CUDA (sm_90): gate/up's SwiGLU tiles counted through L2, not made in clusters.
    NoSwigluCluster,
    /// CUDA (sm_90): each product pulls at most N MiB of the next product's weights into L2.
    PrefetchAhead(usize),
    /// CUDA: a diagnostic: each product of a role (q/k/v or gate/up) launched twice.
    RepeatProduct(ProductRole),
    /// CUDA: each head's attention in one block at any context length.
    NoSplitAttention,
    /// CUDA: each head's attention split over one more block every N positions.
    AttentionSlice(usize),
    /// CUDA (sm_90): clusters up to position N, the split through L2 from there.
    ClusterUntil(usize),
    /// CUDA: decode's attention blocks of N threads (rather than the engine's choice).
    AttentionThreads(usize),
    /// CUDA: the decode products of a role (None: every one) at N threads a row (rather than
    /// `mv_config`'s rule).
    ProductTpr(Option<ProductRole>, usize),
    /// CUDA: the products of one role read the residual normed by the tail of the product
    /// before, the others as the engine chooses.
    NormTailFor(ProductRole),

    /// CUDA: a long context's attention split per query head, not per kv head.
    PerHeadAttention,
    /// CUDA: a split attention per kv head from the first split on, whatever the L2 holds.
    GroupedAttention,
    /// CUDA (sm_90): a split head's slices joined through L2, not in a cluster's shared memory.
    NoClusterAttention,
    /// CUDA (sm_90): every kernel launched after the one before has finished.
    NoPdl,
    /// CUDA (sm_90): each product block pulls its first weights into L2 while it waits.
    PdlPrefetch,
    /// CUDA: the KV cache in f32 (rather than f16, or int8 at w8a8/w4a8).
    F32Kv,
    /// CUDA: the prompt run token by token, as decode (no batched prefill).
    TokenPrefill,
    /// CUDA: nothing changed, the configuration timed again: a bench's first row runs slow
    /// (docs/HIL.md round 43), so comparisons alternate after it.
    Default,
    /// CUDA: the prompt batched N tokens a chunk (the board's `gpu_prefill_batch` otherwise).
    PrefillBatch(usize),
    /// CUDA: the batched prompt's products on the project's PTX kernel rather than cuBLAS.
    PtxProducts,
    /// CUDA: the batched prompt's attention on the scalar kernel rather than tensor cores.
    ScalarAttention,
}

/// Every ablation's name, backend and meaning: `--help` and docs/BENCHMARKS.md print this.
pub const ABLATIONS: &[(&str, &str, &str)] = &[
    ("no-deferred-dequant", "cpu", "w8a8/w4a8: dequantize each weight group to f32 before the dot product (BitLLM's \"convert, then compute\")"),
    ("no-vnni", "cpu", "x86: the AVX2 maddubs+madd dot where the CPU has VNNI"),
    ("no-avx512", "cpu", "x86: the eight-row ymm low-bit kernels where the CPU has AVX-512 VNNI"),
    ("cpu-prefetch", "cpu", "x86: decode's one-pass kernels (w4 swizzled, w8, Q4_K, Q6_K) prefetch their weights in software (the default on Intel CPUs only)"),
    ("no-cpu-prefetch", "cpu", "x86: decode's one-pass kernels leave prefetching to the hardware (the default but on Intel CPUs)"),
    ("k-block-scales", "cpu", "K-quant rows read their input quantized with a scale per 32 values (finer, slower) rather than one per 256 (llama.cpp's Q8_K)"),
    ("cpu-f32-kv", "cpu", "the KV cache in f32 rather than f16 (or int8 at w8a8/w4a8)"),
    ("cpu-per-head-attention", "cpu", "attention a task a query head, each reading its KV head's rows, rather than the query heads of a KV head together reading them once"),
    ("no-graph", "cuda", "every kernel launched, without the per-token CUDA graph"),
    ("narrow", "cuda", "every product kernel narrow (the wide ones off)"),
    ("wide", "cuda", "every product kernel wide (small products too)"),
    ("norm-tail", "cuda", "the residual's norm made once by the last block of the product before"),
    ("norm-tail=ROLE", "cuda", "the products of ROLE (qkv, gate-up or output) read the residual normed once by the last block of the product before, the others as the engine chooses"),
    ("norm-in-block", "cuda", "every product that reads the normed residual norms it in each block, at any size"),
    ("attention-prefetch", "cuda", "extra blocks of the attention launch pull wo and gate/up into L2 while it runs (off by default: it cost 6% a step on an H100, docs/HIL.md round 47)"),
    ("no-prefetch-ahead", "cuda", "sm_90: no product kernel pulls the next product's weights into L2 as it starts"),
    ("prefetch-ahead=N", "cuda", "sm_90: each product kernel pulls at most N MiB of the next product's weights into L2 (rather than a twelfth of the L2)"),
    ("repeat-product=ROLE", "cuda", "a diagnostic, not a speed-up: each product of ROLE (qkv or gate-up) launched a second time right after the first, which finds its weights in L2 (what the product costs from L2)"),
    ("no-swiglu-cluster", "cuda", "sm_90: gate/up's blocks each count themselves into their SwiGLU tile and the tile's last reads it back from L2, rather than the tile's blocks running as a thread block cluster that hands its rows to the first block in shared memory"),
    ("no-split-attention", "cuda", "each head's attention in one block at any context length"),
    ("attention-slice=N", "cuda", "each head's attention split over one more block every N positions"),
    ("attention-threads=N", "cuda", "decode's attention in blocks of N threads (a multiple of 32 up to 1024) rather than the engine's choice (512 where a head and its group fit, else 1024)"),
    ("product-tpr=N", "cuda", "every decode product at N threads a row (a power of two from 8 to 256) rather than the rule's (mv_config: by a row's units, one or four a thread, and the product's role); product-tpr=ROLE:N only the products of ROLE (qkv, wo, gate-up, down or output)"),
    ("cluster-until=N", "cuda", "sm_90: a split head runs as a thread block cluster up to position N, the split through L2 from there (rather than where the rule puts it)"),
    ("per-head-attention", "cuda", "a long context's attention split per query head (each reading its kv head's rows) at any length, never per kv head"),
    ("grouped-attention", "cuda", "a split attention per kv head for all its query heads from the first split on, not only once a layer's cache outgrows half the L2 (clusters off)"),
    ("no-cluster-attention", "cuda", "sm_90: a split head's slices joined through L2 by the last block to finish, not in a thread block cluster's shared memory"),
    ("no-pdl", "cuda", "sm_90: every kernel launched after the one before has finished"),
    ("pdl-prefetch", "cuda", "sm_90: each product block pulls its first weights into L2 while it waits"),
    ("f32-kv", "cuda", "the KV cache in f32 rather than f16 (or int8 at w8a8/w4a8)"),
    ("default", "cuda", "nothing changed: the configuration timed again, to alternate with other rows after the first (which runs about 2% slow on an H100)"),
    ("token-prefill", "cuda", "the prompt run token by token, as decode, rather than batched"),
    ("prefill-batch=N", "cuda", "the prompt batched N tokens a chunk rather than the board's gpu_prefill_batch"),
    ("ptx-products", "cuda", "the batched prompt's products on the project's PTX kernel rather than cuBLAS"),
    ("scalar-attention", "cuda", "the batched prompt's attention on the scalar kernel rather than tensor cores"),
];

/// The ablations, one per line, for `--help`.
pub fn help() -> String {
    ABLATIONS
        .iter()
        .map(|(name, backend, what)| format!("  {name} ({backend}): {what}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every ablation but the ones with a number.
const PLAIN: [Ablation; 27] = {
    use Ablation::*;
    [
        NoDeferredDequant,
        NoVnni,
        NoAvx512,
        CpuPrefetch,
        NoCpuPrefetch,
        KBlockScales,
        CpuPerHeadAttention,
        CpuF32Kv,
        NoGraph,
        Narrow,
        Wide,
        NormTail,
        NormInBlock,
        AttentionPrefetch,
        NoPrefetchAhead,
        NoSwigluCluster,
        NoSplitAttention,
        PerHeadAttention,
        GroupedAttention,
        NoClusterAttention,
        NoPdl,
        PdlPrefetch,
        F32Kv,
        TokenPrefill,
        Default,
        PtxProducts,
        ScalarAttention,
    ]
};

impl Ablation {
    pub fn parse(s: &str) -> Result<Ablation, String> {
        let s = s.trim();
        if let Some(a) = PLAIN.iter().find(|a| a.name() == s) {
            return Ok(*a);
        }
        if let Some(n) = s.strip_prefix("attention-slice=") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Ablation::AttentionSlice(n)),
                _ => Err(format!(
                    "attention-slice takes a positive number of positions, not '{n}'"
                )),
            };
        }
        if let Some(n) = s.strip_prefix("cluster-until=") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Ablation::ClusterUntil(n)),
                _ => Err(format!(
                    "cluster-until takes a positive position, not '{n}'"
                )),
            };
        }
        if let Some(n) = s.strip_prefix("attention-threads=") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 && n <= 1024 && n.is_multiple_of(32) => {
                    Ok(Ablation::AttentionThreads(n))
                }
                _ => Err(format!(
                    "attention-threads takes a multiple of 32 up to 1024, not '{n}'"
                )),
            };
        }
        if let Some(r) = s.strip_prefix("norm-tail=") {
            return match ProductRole::named(r) {
                Some(role) if role.reads_normed_residual() => Ok(Ablation::NormTailFor(role)),
                _ => Err(format!(
                    "norm-tail's role is one of qkv, gate-up or output, not '{r}'"
                )),
            };
        }
        if let Some(v) = s.strip_prefix("product-tpr=") {
            let (role, n) = match v.split_once(':') {
                None => (None, v),
                Some((r, n)) => match ProductRole::named(r) {
                    Some(role) => (Some(role), n),
                    None => {
                        let roles: Vec<&str> = ProductRole::ALL.iter().map(|r| r.name()).collect();
                        return Err(format!(
                            "product-tpr's role is one of {}, not '{r}'",
                            roles.join(", ")
                        ));
                    }
                },
            };
            return match n.parse::<usize>() {
                Ok(n) if product_tpr_fits(n) => Ok(Ablation::ProductTpr(role, n)),
                _ => Err(format!(
                    "product-tpr takes a power of two from 8 to 256, not '{n}'"
                )),
            };
        }
        if let Some(n) = s.strip_prefix("prefetch-ahead=") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Ablation::PrefetchAhead(n)),
                _ => Err(format!(
                    "prefetch-ahead takes a positive number of MiB, not '{n}'"
                )),
            };
        }
        if let Some(r) = s.strip_prefix("repeat-product=") {
            return match ProductRole::named(r) {
                Some(role @ (ProductRole::Qkv | ProductRole::GateUp)) => {
                    Ok(Ablation::RepeatProduct(role))
                }
                _ => Err(format!(
                    "repeat-product's role is qkv or gate-up, not '{r}'"
                )),
            };
        }
        if let Some(n) = s.strip_prefix("prefill-batch=") {
            return match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Ablation::PrefillBatch(n)),
                _ => Err(format!(
                    "prefill-batch takes a positive number of tokens, not '{n}'"
                )),
            };
        }
        let names: Vec<&str> = ABLATIONS.iter().map(|a| a.0).collect();
        Err(format!(
            "unknown ablation '{s}' (one of: {})",
            names.join(", ")
        ))
    }

    /// A comma-separated list (an empty item is an error, so a stray comma is noticed).
    pub fn parse_list(s: &str) -> Result<Vec<Ablation>, String> {
        s.split(',').map(Ablation::parse).collect()
    }

    /// The name `parse` takes, and the suffix a bench row's label gets.
    pub fn name(self) -> String {
        use Ablation::*;
        match self {
            NoDeferredDequant => "no-deferred-dequant".into(),
            NoVnni => "no-vnni".into(),
            NoAvx512 => "no-avx512".into(),
            CpuPrefetch => "cpu-prefetch".into(),
            NoCpuPrefetch => "no-cpu-prefetch".into(),
            KBlockScales => "k-block-scales".into(),
            CpuPerHeadAttention => "cpu-per-head-attention".into(),
            CpuF32Kv => "cpu-f32-kv".into(),
            NoGraph => "no-graph".into(),
            Narrow => "narrow".into(),
            Wide => "wide".into(),
            NormTail => "norm-tail".into(),
            NormInBlock => "norm-in-block".into(),
            AttentionPrefetch => "attention-prefetch".into(),
            NoPrefetchAhead => "no-prefetch-ahead".into(),
            NoSwigluCluster => "no-swiglu-cluster".into(),
            PrefetchAhead(n) => format!("prefetch-ahead={n}"),
            RepeatProduct(r) => format!("repeat-product={}", r.name()),
            NoSplitAttention => "no-split-attention".into(),
            AttentionSlice(n) => format!("attention-slice={n}"),
            ClusterUntil(n) => format!("cluster-until={n}"),
            AttentionThreads(n) => format!("attention-threads={n}"),
            ProductTpr(None, n) => format!("product-tpr={n}"),
            ProductTpr(Some(r), n) => format!("product-tpr={}:{n}", r.name()),
            NormTailFor(r) => format!("norm-tail={}", r.name()),
            PerHeadAttention => "per-head-attention".into(),
            GroupedAttention => "grouped-attention".into(),
            NoClusterAttention => "no-cluster-attention".into(),
            NoPdl => "no-pdl".into(),
            PdlPrefetch => "pdl-prefetch".into(),
            F32Kv => "f32-kv".into(),
            TokenPrefill => "token-prefill".into(),
            Default => "default".into(),
            PrefillBatch(n) => format!("prefill-batch={n}"),
            PtxProducts => "ptx-products".into(),
            ScalarAttention => "scalar-attention".into(),
        }
    }

    /// The backend whose engine it changes.
    pub fn backend(self) -> Backend {
        use Ablation::*;
        match self {
            NoDeferredDequant | NoVnni | NoAvx512 | CpuPrefetch | NoCpuPrefetch | KBlockScales
            | CpuPerHeadAttention | CpuF32Kv => Backend::Cpu,
            _ => Backend::Cuda,
        }
    }

    /// Applies a CPU ablation to the kernels (a CUDA one leaves them as they are).
    pub fn apply_cpu(self, k: &mut KernelSet) {
        match self {
            Ablation::NoDeferredDequant => k.deferred_dequant = false,
            Ablation::NoVnni => k.vnni = false,
            Ablation::NoAvx512 => k.avx512 = false,
            Ablation::CpuPrefetch => k.prefetch = true,
            Ablation::NoCpuPrefetch => k.prefetch = false,
            Ablation::KBlockScales => k.superblock_scales = false,
            Ablation::CpuPerHeadAttention => k.grouped_attention = false,
            _ => {}
        }
    }

    /// The KV cache a CPU ablation asks for (`cpu-f32-kv`), if any.
    pub fn cpu_kv(self) -> Option<KvChoice> {
        (self == Ablation::CpuF32Kv).then_some(KvChoice::F32)
    }

    /// Applies a CUDA ablation to the decoder's options (a CPU one leaves them as they are).
    pub fn apply_cuda(self, o: &mut CudaOptions) {
        use Ablation::*;
        match self {
            NoGraph => o.graph = false,
            Narrow => o.products = ProductKernels::Narrow,
            Wide => o.products = ProductKernels::Wide,
            NormTail => o.in_block_norm = InBlockNorm::Never,
            NormInBlock => o.in_block_norm = InBlockNorm::Always,
            AttentionPrefetch => o.prefetch = true,
            NoPrefetchAhead => o.prefetch_ahead = Some(0),
            NoSwigluCluster => o.swiglu_cluster = false,
            PrefetchAhead(n) => o.prefetch_ahead = Some(n << 20),
            RepeatProduct(r) => o.repeat_product = Some(r),
            NoSplitAttention => o.attention_slice = 0,
            AttentionSlice(n) => o.attention_slice = n,
            ClusterUntil(n) => o.cluster_until = n,
            AttentionThreads(n) => o.attention_threads = n,
            ProductTpr(None, n) => o.product_tpr = [n; ProductRole::ALL.len()],
            ProductTpr(Some(r), n) => o.product_tpr[r as usize] = n,
            NormTailFor(r) => o.norm_tail_for[r as usize] = true,
            PerHeadAttention => o.grouped_attention = GroupedAttentionMode::Never,
            GroupedAttention => {
                o.grouped_attention = GroupedAttentionMode::Always;
                o.cluster_attention = false;
            }
            NoClusterAttention => o.cluster_attention = false,
            NoPdl => o.dependent_launch = DependentLaunch::Off,
            PdlPrefetch => o.dependent_launch = DependentLaunch::Prefetch,
            F32Kv => o.kv = KvChoice::F32,
            TokenPrefill => o.prefill_batch = 1,
            Default => {}
            PrefillBatch(n) => o.prefill_batch = n,
            PtxProducts => o.prefill_products = PrefillProducts::Ptx,
            ScalarAttention => o.prefill_tensor_attention = false,
            NoDeferredDequant | NoVnni | NoAvx512 | CpuPrefetch | NoCpuPrefetch | KBlockScales
            | CpuPerHeadAttention | CpuF32Kv => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_parses_back_to_itself() {
        assert_eq!(ABLATIONS.len(), PLAIN.len() + 8);
        for (name, backend, _) in ABLATIONS {
            let name = name
                .replace("=N", "=64")
                .replace("repeat-product=ROLE", "repeat-product=gate-up")
                .replace("=ROLE", "=output");
            let a = Ablation::parse(&name).unwrap();
            assert_eq!(a.name(), name);
            assert_eq!(a.backend().name(), *backend, "{name}");
        }
    }

    #[test]
    fn ablations_change_only_their_own_option() {
        let mut k = KernelSet::best();
        Ablation::NoVnni.apply_cpu(&mut k);
        assert_eq!(
            k,
            KernelSet {
                vnni: false,
                ..KernelSet::best()
            }
        );
        Ablation::NoGraph.apply_cpu(&mut k);
        assert!(!k.vnni && k.deferred_dequant && k.avx512);
        let mut o = CudaOptions::default();
        Ablation::AttentionSlice(64).apply_cuda(&mut o);
        Ablation::ClusterUntil(4608).apply_cuda(&mut o);
        Ablation::PrefetchAhead(8).apply_cuda(&mut o);
        Ablation::AttentionThreads(512).apply_cuda(&mut o);
        Ablation::ProductTpr(Some(ProductRole::Down), 8).apply_cuda(&mut o);
        Ablation::NormTailFor(ProductRole::GateUp).apply_cuda(&mut o);
        Ablation::Default.apply_cuda(&mut o);
        Ablation::NoVnni.apply_cuda(&mut o);
        let want = CudaOptions {
            attention_slice: 64,
            attention_threads: 512,
            product_tpr: [0, 0, 0, 8, 0],
            norm_tail_for: [false, false, true, false, false],
            cluster_until: 4608,
            prefetch_ahead: Some(8 << 20),
            ..CudaOptions::default()
        };
        assert_eq!(format!("{o:?}"), format!("{want:?}"));
    }

    #[test]
    fn bad_lists_are_refused_with_the_names() {
        let e = Ablation::parse_list("no-vnni,,narrow").unwrap_err();
        assert!(e.contains("unknown ablation ''"), "{e}");
        let e = Ablation::parse("no-vni").unwrap_err();
        assert!(e.contains("no-vnni") && e.contains("f32-kv"), "{e}");
        assert!(Ablation::parse("attention-slice=0").is_err());
        assert!(Ablation::parse("attention-slice=x").is_err());
        assert!(Ablation::parse("prefill-batch=0").is_err());
        assert!(Ablation::parse("cluster-until=0").is_err());
        assert!(Ablation::parse("prefetch-ahead=0").is_err());
        for bad in ["wo", "down", "output", ""] {
            let e = Ablation::parse(&format!("repeat-product={bad}")).unwrap_err();
            assert!(
                e.contains("qkv or gate-up") && e.contains(&format!("'{bad}'")),
                "{e}"
            );
        }
        for bad in ["4", "24", "512", "x", "down:4", "wo:"] {
            let e = Ablation::parse(&format!("product-tpr={bad}")).unwrap_err();
            assert!(e.contains("power of two from 8 to 256"), "{e}");
        }
        let e = Ablation::parse("product-tpr=ffn:16").unwrap_err();
        assert!(e.contains("gate-up") && e.contains("'ffn'"), "{e}");
        // norm-tail takes only the roles that read the normed residual.
        for bad in ["wo", "down", "ffn", ""] {
            let e = Ablation::parse(&format!("norm-tail={bad}")).unwrap_err();
            assert!(
                e.contains("qkv, gate-up or output") && e.contains(&format!("'{bad}'")),
                "{e}"
            );
        }
        for role in [ProductRole::Qkv, ProductRole::GateUp, ProductRole::Output] {
            let name = format!("norm-tail={}", role.name());
            let a = Ablation::parse(&name).unwrap();
            assert_eq!((a, a.name()), (Ablation::NormTailFor(role), name));
        }
        // Every role's name parses back to itself and sets only its own entry.
        for role in ProductRole::ALL {
            let name = format!("product-tpr={}:32", role.name());
            let a = Ablation::parse(&name).unwrap();
            assert_eq!((a, a.name()), (Ablation::ProductTpr(Some(role), 32), name));
            let mut o = CudaOptions::default();
            a.apply_cuda(&mut o);
            let set: Vec<usize> = ProductRole::ALL
                .iter()
                .map(|&r| o.product_tpr[r as usize])
                .collect();
            assert_eq!(set.iter().sum::<usize>(), 32);
            assert_eq!(o.product_tpr[role as usize], 32);
        }
        let mut o = CudaOptions::default();
        Ablation::parse("product-tpr=16")
            .unwrap()
            .apply_cuda(&mut o);
        assert_eq!(o.product_tpr, [16; 5]);
        assert_eq!(
            Ablation::parse("cluster-until=4608"),
            Ok(Ablation::ClusterUntil(4608))
        );
    }
}
