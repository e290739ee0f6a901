//! How decode's attention splits over blocks: the host side of attention.cuh's
//! `attention_launch` (its `max_slices`, `max_group_slices` and `group_from`), chosen once at
//! boot from the GPU and the model.

use crate::engine::cuda_options::{CudaOptions, GroupedAttention};
use crate::kv::KvPrecision;
use crate::model::Hyper;

/// How decode's attention splits over blocks, for one GPU and model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSplit {
    /// Most blocks a query head's attention is split over.
    pub max_slices: usize,
    /// Most blocks a kv head's attention is split over in grouped mode (all its query heads a
    /// block); 0: never grouped.
    pub max_group_slices: usize,
    /// The position grouped mode starts at.
    pub group_from: usize,
    /// Blocks of the thread block cluster a split head runs as (sm_90: attention.cuh's
    /// `attention_cluster`, whose slices join in shared memory) below `cluster_until`; 0: no
    /// clusters, the slices always join through L2.
    pub cluster: usize,
    /// The position from which a cluster's blocks split its head.
    pub cluster_slice: usize,
    /// The position from which the split above runs instead of clusters.
    pub cluster_until: usize,
    /// Blocks the GPU runs at once as clusters: the cluster launch's grid, at most.
    pub cluster_wave: usize,
    /// Threads of an attention block (`attention_threads`).
    pub threads: usize,
}

impl AttentionSplit {
    /// The split on a GPU that runs `resident` attention blocks of `threads` threads at once
    /// and has `l2_bytes` of L2, for a model of `h` whose cache holds `kv`. Split attention
    /// fills the GPU with one wave of attention blocks at most: a second wave would cost a
    /// whole block's time at once (a step in latency per token).
    pub(super) fn plan(
        (resident, threads): (usize, usize),
        l2_bytes: usize,
        h: &Hyper,
        kv: KvPrecision,
        opts: &CudaOptions,
    ) -> AttentionSplit {
        let int8_kv = kv == KvPrecision::I8;
        let position_bytes = position_bytes(h, kv);
        let slice = opts.attention_slice;
        let (max_group_slices, group_from) = match opts.grouped_attention {
            GroupedAttention::Never => (0, 0),
            mode => (
                max_group_slices(
                    resident,
                    (h.n_heads, h.n_kv_heads, h.head_dim),
                    int8_kv,
                    slice,
                    threads,
                ),
                match mode {
                    GroupedAttention::Always => slice,
                    _ => group_from(l2_bytes, position_bytes, slice),
                },
            ),
        };
        AttentionSplit {
            max_slices: max_slices(resident, h.n_heads, slice),
            max_group_slices,
            group_from,
            cluster: 0,
            cluster_slice: 0,
            cluster_until: 0,
            cluster_wave: 0,
            threads,
        }
    }

    /// This split with heads run as clusters of `cluster` blocks, `wave` blocks of which the
    /// GPU runs at once (`cluster_size` chose both; 0: none), at short and middle lengths, on a
    /// split every `attention_slice` positions. A cluster's join costs little (measured:
    /// docs/BENCHMARKS.md), so its blocks split a head four times sooner. It gives way to the
    /// split through L2 where that one would have more slices than a cluster (`cluster *
    /// attention_slice` positions; measured on the H200: the two cross near there): from
    /// there on its slices are the shorter, and a long context is rounds of loads. The launch
    /// is one wave of clusters (those that do not fit wait for a whole cluster's room), so the
    /// split through L2 and the prefetch keep within it. `until`, where not 0, puts the hand-over
    /// there instead (`CudaOptions::cluster_until`: measured, docs/BENCHMARKS.md).
    pub(super) fn with_cluster(
        self,
        (cluster, wave): (usize, usize),
        attention_slice: usize,
        until: usize,
        (n_heads, n_kv_heads): (usize, usize),
    ) -> AttentionSplit {
        if cluster < 2 || attention_slice == 0 {
            return self;
        }
        let max_slices = self.max_slices.min(wave / n_heads.max(1)).max(cluster);
        AttentionSplit {
            max_slices,
            max_group_slices: self.max_group_slices.min(wave / n_kv_heads.max(1)),
            cluster,
            cluster_slice: (attention_slice / 4).max(1),
            cluster_until: match until {
                0 => cluster * attention_slice,
                n => n,
            },
            cluster_wave: wave,
            ..self
        }
    }

    /// The blocks a launch needs for the widest split of either mode.
    pub(super) fn blocks(&self, h: &Hyper) -> usize {
        (h.n_heads * self.max_slices.max(self.cluster)).max(h.n_kv_heads * self.max_group_slices)
    }

    /// The launch's grid for at least `blocks` blocks: whole clusters when split as clusters.
    pub(super) fn grid(&self, blocks: usize) -> usize {
        match self.cluster {
            0 => blocks,
            c => (blocks.div_ceil(c) * c).min(self.cluster_wave),
        }
    }

    /// Parts (max, sum and head_dim values each) the split's blocks leave for the join.
    pub(super) fn parts(&self, h: &Hyper) -> usize {
        self.max_slices.max(self.max_group_slices) * h.n_heads
    }
}

/// Most blocks a head's attention is split over on a GPU that runs `resident` attention blocks
/// at once: all heads' slices together are one wave of them; 1 when splitting is off
/// (`attention_slice` 0) or the heads alone fill the GPU.
fn max_slices(resident: usize, n_heads: usize, attention_slice: usize) -> usize {
    if attention_slice == 0 {
        return 1;
    }
    (resident / n_heads.max(1)).clamp(1, ATTENTION_JOIN_PARTS)
}

/// The cluster size a split head runs as, where clusters are allowed (`cluster_attention`,
/// sm_90) and splitting is on: the largest power of two up to attention.cuh's
/// ATTENTION_CLUSTER_MAX (8, the portable size) and `max_slices` for which every head's cluster
/// runs at once (`resident_clusters(c)`: the driver's count), with the blocks those clusters
/// hold; (0, 0) where none is of 2 or more.
pub(super) fn cluster_size(
    max_slices: usize,
    n_heads: usize,
    resident_clusters: impl Fn(usize) -> usize,
) -> (usize, usize) {
    let mut c = ATTENTION_CLUSTER_MAX.min(max_slices);
    c = if c >= 2 { 1 << c.ilog2() } else { 0 };
    while c >= 2 {
        let n = resident_clusters(c);
        if n >= n_heads {
            return (c, n * c);
        }
        c /= 2;
    }
    (0, 0)
}

/// attention.cuh's ATTENTION_CLUSTER_MAX.
const ATTENTION_CLUSTER_MAX: usize = 8;

/// The most parts (heads times slices) one block joins: attention.cuh's `join_slices` folds each
/// part's max and sum in the attention block's 32 x 256 floats of shared memory.
const ATTENTION_JOIN_PARTS: usize = 32 * 256 / 2;

/// The position from which a split attention takes a kv head's query heads a block
/// (`GroupedAttention::Auto`): where one layer's keys and values (`position_bytes` a position)
/// outgrow half of an L2 of `l2_bytes`; never before the split starts.
fn group_from(l2_bytes: usize, position_bytes: usize, attention_slice: usize) -> usize {
    (l2_bytes / 2 / position_bytes.max(1)).max(attention_slice)
}

/// Most blocks a kv head's attention is split over in grouped mode (attention.cuh's
/// `attention_launch`: a block takes the `group` query heads of a kv head, its warps split
/// among them), on a GPU that runs `resident` attention blocks of `threads` at once: one wave
/// over the kv heads. 0 (grouped mode off) where splitting is off or a group does not fit a
/// block (`group_fits`).
fn max_group_slices(
    resident: usize,
    heads: (usize, usize, usize),
    int8_kv: bool,
    attention_slice: usize,
    threads: usize,
) -> usize {
    let (n_heads, n_kv_heads, _) = heads;
    if attention_slice == 0 || !group_fits(heads, int8_kv, threads) {
        return 0;
    }
    (resident / n_kv_heads).clamp(1, ATTENTION_JOIN_PARTS / (n_heads / n_kv_heads))
}

/// Whether a block of `threads` can take a kv head's query heads (grouped mode): the heads
/// are grouped; their queries and outputs (group x head_dim floats) fit 1024 floats of shared
/// memory; a warp a head at least; a thread for every two items of the pairs of q and k it
/// rotates and the values of v; and with an int8 cache a warp for each group of 32 of k, v
/// and every query.
fn group_fits(
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    int8_kv: bool,
    threads: usize,
) -> bool {
    let group = n_heads / n_kv_heads.max(1);
    let warps = threads / 32;
    group > 1
        && group <= warps
        && group * head_dim <= 1024
        && (group + 1) * head_dim / 2 + head_dim <= 2 * threads
        && (!int8_kv || (2 + group) * (head_dim / 32) <= warps)
}

/// Whether a decode attention block of `threads` can run a head of `head_dim` alone (what
/// boot checks an asked-for count against): a multiple of 32 up to 1024, a thread for every
/// two of the head's rotated pairs of q and k and values of v (2 x head_dim), and with an
/// int8 cache a warp for each group of 32 of q, k and v (`int8_warps`).
pub(super) fn block_holds_head(head_dim: usize, int8_kv: bool, threads: usize) -> bool {
    threads <= 1024
        && threads.is_multiple_of(32)
        && threads >= 2 * head_dim
        && (!int8_kv || threads / 32 >= int8_warps(head_dim))
}

/// Warps an int8 cache's attention block needs for a head of `head_dim`: one for each group of
/// 32 of q, k and v that it quantizes.
pub(super) fn int8_warps(head_dim: usize) -> usize {
    3 * head_dim / 32
}

/// Bytes of one position of one layer's keys and values in a cache of `kv`.
fn position_bytes(h: &Hyper, kv: KvPrecision) -> usize {
    let kv_dim = h.n_kv_heads * h.head_dim;
    if kv == KvPrecision::I8 {
        2 * (kv_dim + kv_dim / 32 * 4)
    } else {
        2 * kv_dim * kv.value_bytes()
    }
}

/// Threads of a decode attention block: `CudaOptions::attention_threads`, or where that is 0
/// the choice here. 512 by default: 16 warps, half the registers of 1024, so the attention
/// blocks become resident beside the q/k/v product's last blocks rather than after them
/// (docs/HIL.md rounds 38-39, an H100 at the 1.5B shape: decode after one token +1.3-3.3%
/// against 1024; at 4,096 level, q8_0 +1.7%). 1024 where a head needs more (a thread for
/// every two pairs of q and k and values of v: heads over 256; an int8 cache's warp a group of
/// 32 of q, k and v), or where 512 would give up grouped mode (`group_fits`) at a position this
/// engine's `context` reaches on a GPU with `l2_bytes` of L2 (`group_from`).
pub(super) fn attention_threads(
    h: &Hyper,
    kv: KvPrecision,
    l2_bytes: usize,
    context: usize,
    opts: &CudaOptions,
) -> usize {
    const SMALL: usize = 512;
    if opts.attention_threads != 0 {
        return opts.attention_threads;
    }
    let heads = (h.n_heads, h.n_kv_heads, h.head_dim);
    let int8_kv = kv == KvPrecision::I8;
    let grouped_from = match opts.grouped_attention {
        GroupedAttention::Never => usize::MAX,
        GroupedAttention::Always => opts.attention_slice,
        GroupedAttention::Auto => group_from(l2_bytes, position_bytes(h, kv), opts.attention_slice),
    };
    let loses_grouped = opts.attention_slice > 0
        && grouped_from < context
        && group_fits(heads, int8_kv, 1024)
        && !group_fits(heads, int8_kv, SMALL);
    if block_holds_head(h.head_dim, int8_kv, SMALL) && !loses_grouped {
        SMALL
    } else {
        1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda_options::ATTENTION_SLICE;

    /// Split attention, one wave: an H200 runs one 1024-thread attention block per
    /// multiprocessor (its registers), so 132 at once: 11 slices a head at the 1.5B shape (12
    /// heads), 14 at SmolLM2's (9); an Orin (16) 1; off, or more heads than blocks, means one a
    /// head.
    #[test]
    fn attention_splits_into_one_wave() {
        assert_eq!(max_slices(132, 12, ATTENTION_SLICE), 11);
        assert_eq!(max_slices(132, 9, ATTENTION_SLICE), 14);
        assert_eq!(max_slices(16, 12, ATTENTION_SLICE), 1);
        assert_eq!(max_slices(16, 64, ATTENTION_SLICE), 1);
        assert_eq!(max_slices(132, 12, 0), 1);
    }

    /// Grouped attention, one wave over the kv heads where a group fits a block: the 1.5B
    /// shape (12 heads of 128 over 2) 66 slices a kv head with either cache; SmolLM2 (9 of 64
    /// over 3) 44; an Orin 8; never for one query head a kv head (Llama-2-7B), a group wider
    /// than a block's 1024 floats, an int8 cache's group that needs more than 32 warps to
    /// quantize, or splitting off.
    #[test]
    fn grouped_attention_splits_kv_heads_into_one_wave_where_a_group_fits() {
        assert_eq!(
            max_group_slices(132, (12, 2, 128), false, ATTENTION_SLICE, 1024),
            66
        );
        assert_eq!(
            max_group_slices(132, (12, 2, 128), true, ATTENTION_SLICE, 1024),
            66
        );
        assert_eq!(
            max_group_slices(132, (9, 3, 64), true, ATTENTION_SLICE, 1024),
            44
        );
        assert_eq!(
            max_group_slices(16, (12, 2, 128), false, ATTENTION_SLICE, 1024),
            8
        );
        assert_eq!(
            max_group_slices(132, (32, 32, 128), false, ATTENTION_SLICE, 1024),
            0
        );
        assert_eq!(
            max_group_slices(132, (16, 2, 256), false, ATTENTION_SLICE, 1024),
            0
        );
        assert_eq!(
            max_group_slices(132, (16, 2, 128), false, ATTENTION_SLICE, 1024),
            66
        );
        assert_eq!(
            max_group_slices(132, (16, 2, 128), true, ATTENTION_SLICE, 1024),
            0
        );
        assert_eq!(max_group_slices(132, (12, 2, 128), false, 0, 1024), 0);
        // Blocks of 512 threads (two a multiprocessor): the 1.5B shape's group of 6 (576
        // items to rotate and copy, two a thread) fits, but not its int8 cache (8 groups of 4
        // warps to quantize); SmolLM2's group of 3 (heads of 64) fits, int8 cache too.
        assert_eq!(
            max_group_slices(264, (12, 2, 128), false, ATTENTION_SLICE, 512),
            132
        );
        assert_eq!(
            max_group_slices(264, (12, 2, 128), true, ATTENTION_SLICE, 512),
            0
        );
        assert_eq!(
            max_group_slices(264, (9, 3, 64), true, ATTENTION_SLICE, 512),
            88
        );
        // The join's shared memory caps the parts: 4096 over a group of 8.
        assert_eq!(
            max_group_slices(100_000, (16, 2, 64), false, ATTENTION_SLICE, 1024),
            512
        );
    }

    /// Clusters: 8 blocks a head on an H200 (132 one-block multiprocessors, two clusters of 8
    /// in each GPC of 16-18) for the 1.5B shape's 12 heads; 4 where only 4 slices fit a head
    /// (32 heads); smaller where the GPU runs too few clusters at once for every head; none
    /// where a head gets one slice.
    #[test]
    fn clusters_are_the_widest_power_of_two_that_runs_every_head_at_once() {
        let h200 = |c: usize| 132 / 16 * (16 / c);
        assert_eq!(cluster_size(11, 12, h200), (8, 128));
        assert_eq!(cluster_size(14, 9, h200), (8, 128));
        assert_eq!(cluster_size(4, 32, h200), (4, 128));
        assert_eq!(cluster_size(11, 20, h200), (4, 128));
        assert_eq!(cluster_size(1, 12, h200), (0, 0));
        assert_eq!(cluster_size(11, 12, |_| 0), (0, 0));
        let split = AttentionSplit {
            max_slices: 11,
            max_group_slices: 66,
            group_from: 12_800,
            cluster: 0,
            cluster_slice: 0,
            cluster_until: 0,
            cluster_wave: 0,
            threads: 1024,
        };
        // The 1.5B shape: clusters from 64 positions (a quarter of the split's 256) to 2,048,
        // where the split through L2 would take 9 slices a head; that one then up to 10: the
        // 128 blocks of one wave of clusters hold 10 of its 11 (and 64 of grouped mode's 66 a
        // kv head).
        let c = split.with_cluster((8, 128), 256, 0, (12, 2));
        assert_eq!(
            (c.cluster, c.cluster_slice, c.cluster_until),
            (8, 64, 2_048)
        );
        assert_eq!(
            (c.max_slices, c.max_group_slices, c.group_from),
            (10, 64, 12_800)
        );
        assert_eq!(c.grid(137), 128);
        assert_eq!(c.grid(100), 104);
        // `cluster-until=N` moves only the hand-over; without clusters it changes nothing.
        let later = split.with_cluster((8, 128), 256, 4_608, (12, 2));
        assert_eq!(
            later,
            AttentionSplit {
                cluster_until: 4_608,
                ..c
            }
        );
        assert_eq!(split.with_cluster((0, 0), 256, 4_608, (12, 2)), split);
        assert_eq!(split.with_cluster((8, 128), 0, 0, (12, 2)), split);
        assert_eq!(split.grid(137), 137);
    }

    /// Grouped mode starts where a layer's keys and values outgrow half the L2: the 1.5B
    /// shape's f32 cache (2 x 256 floats a position) at 12,800 positions on a 50 MiB L2 (an
    /// H100's) and 1,024 on an AGX Orin's 4 MiB; its int8 cache (256 bytes and 8 scales each)
    /// at 45,511; never before the first split.
    #[test]
    fn grouped_attention_starts_where_a_layers_cache_outgrows_half_the_l2() {
        let mib = 1 << 20;
        assert_eq!(group_from(50 * mib, 2 * 256 * 4, ATTENTION_SLICE), 12_800);
        assert_eq!(group_from(4 * mib, 2 * 256 * 4, ATTENTION_SLICE), 1_024);
        assert_eq!(
            group_from(50 * mib, 2 * (256 + 32), ATTENTION_SLICE),
            45_511
        );
        assert_eq!(
            group_from(64 * 1024, 2 * 256 * 4, ATTENTION_SLICE),
            ATTENTION_SLICE
        );
    }

    /// Blocks of 512 threads wherever they hold a head and, where grouped mode starts within
    /// the context, the group: the 1.5B shape (heads of 128, 6 a kv head) with either float
    /// cache; with the int8 cache only while grouped mode stays past the context (an H100's 50
    /// MiB L2 holds 45,511 positions a layer) or is off, as for 1,024 at an Orin's 4 MiB. An
    /// int8 cache's heads of 256 take 1024 (24 warps quantize k, v and q); an explicit count is
    /// kept.
    #[test]
    fn attention_blocks_are_512_threads_where_a_head_and_its_group_fit() {
        let mut h = Hyper::qwen2_1_5b();
        let (h100, orin) = (50 << 20, 4 << 20);
        let auto = CudaOptions::default();
        let threads =
            |h: &Hyper, kv, l2, ctx, o: &CudaOptions| attention_threads(h, kv, l2, ctx, o);
        assert_eq!(threads(&h, KvPrecision::F16, h100, 32768, &auto), 512);
        assert_eq!(threads(&h, KvPrecision::F32, orin, 32768, &auto), 512);
        assert_eq!(threads(&h, KvPrecision::I8, h100, 32768, &auto), 512);
        assert_eq!(threads(&h, KvPrecision::I8, orin, 32768, &auto), 1024);
        assert_eq!(threads(&h, KvPrecision::I8, orin, 1024, &auto), 512);
        let never = CudaOptions {
            grouped_attention: GroupedAttention::Never,
            ..auto
        };
        assert_eq!(threads(&h, KvPrecision::I8, orin, 32768, &never), 512);
        let set = CudaOptions {
            attention_threads: 256,
            ..auto
        };
        assert_eq!(threads(&h, KvPrecision::F16, h100, 32768, &set), 256);
        h.head_dim = 256;
        assert_eq!(threads(&h, KvPrecision::F16, h100, 32768, &auto), 512);
        assert_eq!(threads(&h, KvPrecision::I8, h100, 32768, &auto), 1024);
    }
}
