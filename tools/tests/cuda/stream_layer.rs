//! The streamed FFN on the GPU fed by the I/O lanes from a flash image
//! (backend/cuda/stream_layer.rs): each parity model's image, written here at w8a8 (Q8_0
//! blocks) and read back with O_DIRECT through real lanes into a weight cache in mapped pinned
//! memory, layer after layer with blocks evicted and re-read; the GPU sum equals the CPU's over
//! the same blocks in both memory models; stages reach the CPU once each; a read that fails or
//! never finishes ends that layer with an error naming the block, and the next layer is right.

use super::{gpu_or_skip, max_rel, Rng};
use leanstream::backend::cuda::driver::{Gpu, MappedHost};
use leanstream::backend::cuda::stream_layer::{
    CacheMemory, GpuStreamError, GpuStreamedFfn, LayerBlocks,
};
use leanstream::board::MemoryModel;
use leanstream::model::flash::FlashImage;
use leanstream::quant::Precision;
use leanstream::stream::backend::best_backend;
use leanstream::stream::fault::{Fault, FaultBackend, FaultKind};
use leanstream::stream::{
    flags_from_words, BlockId, FileId, LaneConfig, Lanes, Policy, ReadErrorKind, WeightCache,
};
use leanstream_tools::bench::ffn_ref::block_ffn as cpu_layer;
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions};
use leanstream_tools::offline::placement::{Active, PlacementKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The GGUF parity models named in $LEANSTREAM_HIL_MODELS, as w8a8 flash images for this
/// board in a temporary folder.
pub(super) fn w8_images() -> Option<Vec<(String, PathBuf)>> {
    let Ok(list) = std::env::var("LEANSTREAM_HIL_MODELS") else {
        eprintln!("skipped: LEANSTREAM_HIL_MODELS names no parity models");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("leanstream-gpu-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut out = Vec::new();
    for path in list.split(',').filter(|p| p.ends_with(".gguf")) {
        let name = Path::new(path)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let image = dir.join(format!("{name}.w8.flash"));
        let o = FlashOptions {
            board: BoardTarget::load(leanstream::board::NAME).unwrap(),
            precision: Precision::W8a8,
            placement: PlacementKind::Identity,
            thresholds: None,
            trace: None,
            eval_trace: None,
            active: Active::TopK { keep: 0.2 },
            block_units: 1,
            run_blocks: None,
        };
        write_image(Path::new(path), &image, &o, &mut |_, _| {}).unwrap();
        out.push((name, image));
    }
    if out.is_empty() {
        eprintln!("skipped: no GGUF among the parity models");
        return None;
    }
    Some(out)
}

/// An image's cache, lanes and GPU side, with a fault-injecting backend.
struct Rig {
    img: FlashImage,
    base: Vec<BlockId>,
    mem: CacheMemory,
    staging: MappedHost,
    flags: Vec<u32>,
    slot_bytes: usize,
    slots: usize,
    cfg: LaneConfig,
}

impl Rig {
    fn new(gpu: &Gpu, path: &Path, model: MemoryModel, cache_share: f64) -> Rig {
        let img = FlashImage::open(path).unwrap();
        let mut base = vec![0];
        for l in 0..img.layers() {
            base.push(base[l] + img.blocks(l) as BlockId);
        }
        let slot_bytes = (0..img.layers())
            .map(|l| img.geometry(l).block_bytes as usize)
            .max()
            .unwrap();
        let max_blocks = (0..img.layers()).map(|l| img.blocks(l)).max().unwrap();
        let total = *base.last().unwrap() as usize;
        let cfg = LaneConfig {
            lanes: 4,
            queue_depth: 8,
            block_bytes: slot_bytes,
            align: 4096,
            retries: 1,
            queue_capacity: 4 * total.max(64),
            merge_blocks: 4,
        };
        // The largest layer plus every read in flight, at least; else the share asked for.
        let slots = ((total as f64 * cache_share) as usize).max(max_blocks + 32 + 8);
        let stride = slot_bytes.next_multiple_of(64);
        Rig {
            mem: CacheMemory::new(gpu, model, slots * stride).unwrap(),
            staging: gpu.alloc_mapped(cfg.staging_bytes()).unwrap(),
            flags: vec![0; total],
            img,
            base,
            slot_bytes,
            slots,
            cfg,
        }
    }
}

/// Runs `body` with the rig's cache and lanes over `faults`.
fn with_lanes<R>(
    rig: &mut Rig,
    faults: &[Fault],
    body: impl FnOnce(
        &FlashImage,
        &[BlockId],
        &mut Lanes,
        FileId,
        &mut WeightCache,
        leanstream::backend::cuda::stream_layer::CacheView,
    ) -> R,
) -> R {
    let total = rig.flags.len();
    let (arena, view) = rig.mem.split();
    let flags = flags_from_words(&mut rig.flags);
    let mut cache = WeightCache::new(
        arena,
        rig.slot_bytes,
        rig.slots,
        Policy::Lru,
        flags,
        &[],
        None,
    )
    .unwrap();
    let inner = best_backend(rig.cfg.lanes, rig.cfg.queue_depth);
    let mut backend =
        FaultBackend::new(inner, total, rig.cfg.lanes * rig.cfg.queue_depth).shuffled(0x5eed);
    for &f in faults {
        backend = backend.with_fault(f);
    }
    let staging = rig.staging.as_mut_slice();
    let mut lanes = Lanes::new(rig.cfg, staging, total, Box::new(backend)).unwrap();
    let file = lanes.open(rig.img.path().unwrap()).unwrap();
    body(&rig.img, &rig.base, &mut lanes, file, &mut cache, view)
}

/// A random `share` of the layer's blocks in a random priority order.
fn random_order(rng: &mut Rng, blocks: usize, share: f64) -> Vec<u32> {
    let mut all: Vec<u32> = (0..blocks as u32).collect();
    rng.shuffle(&mut all);
    all.truncate(((blocks as f64 * share) as usize).max(1));
    all
}

#[test]
fn streamed_layers_from_the_lanes_match_the_cpu() {
    let Some(gpu) = gpu_or_skip() else { return };
    let Some(images) = w8_images() else { return };
    for (name, path) in &images {
        for model in [MemoryModel::Unified, MemoryModel::Discrete] {
            let mut rig = Rig::new(&gpu, path, model, 0.6);
            let (img_dim, max_blocks, max_k) = {
                let g = rig.img.geometry(0);
                let mb = (0..rig.img.layers())
                    .map(|l| rig.img.blocks(l))
                    .max()
                    .unwrap();
                let k = (0..rig.img.layers())
                    .map(|l| rig.img.geometry(l).per_block as usize)
                    .max()
                    .unwrap();
                (g.dim as usize, mb, k)
            };
            let mut gpu_ffn =
                GpuStreamedFfn::new(&gpu, model, img_dim, max_blocks, max_k, 4, rig.slots).unwrap();
            let mut rng = Rng(0xabc ^ name.len() as u64);
            let (mut hits, mut blocks, mut worst) = (0usize, 0usize, 0f32);
            let t = Instant::now();
            with_lanes(&mut rig, &[], |img, base, lanes, file, cache, view| {
                // Three passes over the layers: later passes hit what stayed in the cache.
                for pass in 0..3 {
                    for (l, &layer_base) in base.iter().enumerate().take(img.layers()) {
                        let x: Vec<f32> = (0..img_dim).map(|_| rng.unit()).collect();
                        let order = random_order(&mut rng, img.blocks(l), 0.5);
                        let thr = if pass == 2 { 0.01 } else { 0.0 };
                        let mut out = vec![0f32; img_dim];
                        let mut staged = Vec::new();
                        let req = LayerBlocks {
                            image: img,
                            file,
                            layer: l,
                            base: layer_base,
                            order: &order,
                            means: 0,
                        };
                        let stats = gpu_ffn
                            .forward_layer(
                                &gpu,
                                view,
                                req,
                                4,
                                &x,
                                thr,
                                lanes,
                                cache,
                                &mut |s, partial, _, _| {
                                    assert!(partial.iter().all(|v| v.is_finite()));
                                    staged.push(s)
                                },
                                &mut out,
                            )
                            .unwrap_or_else(|e| panic!("{name} {model:?} layer {l}: {e}"));
                        let cpu = cpu_layer(img, l, &order, &x, thr);
                        let err = max_rel(&out, &cpu);
                        worst = worst.max(err);
                        // thr > 0: a neuron at the threshold may fall either side.
                        let gate = if thr > 0.0 { 2e-3 } else { 1e-4 };
                        assert!(
                            err < gate,
                            "{name} {model:?} layer {l} pass {pass}: off by {err}"
                        );
                        staged.sort_unstable();
                        let want: Vec<usize> = (0..4.min(order.len())).collect();
                        assert_eq!(staged, want, "each stage handed to the CPU once");
                        assert_eq!(stats.blocks, order.len());
                        hits += stats.hits;
                        blocks += stats.blocks;
                    }
                }
            });
            eprintln!(
                "gpu stream {name} {model:?}: {blocks} blocks, {hits} hits, max |gpu-cpu|/max|cpu| = {worst:.2e}, {:?}",
                t.elapsed()
            );
            assert!(
                hits > 0 && hits < blocks,
                "{name}: the cache both hit and missed"
            );
        }
    }
}

/// A read that fails for good (EIO on every attempt) ends its layer with that read's error, and
/// one that never completes ends it with the block named after the time bound; the next layer
/// on the same lanes and cache is right.
#[test]
fn streamed_layer_ends_on_a_failed_or_stalled_read_and_the_next_is_right() {
    let Some(gpu) = gpu_or_skip() else { return };
    let Some(images) = w8_images() else { return };
    let (name, path) = &images[0];
    for model in [MemoryModel::Unified, MemoryModel::Discrete] {
        for kind in [FaultKind::Eio, FaultKind::Delay(u32::MAX)] {
            let mut rig = Rig::new(&gpu, path, model, 1.0);
            let dim = rig.img.geometry(0).dim as usize;
            let max_blocks = (0..rig.img.layers())
                .map(|l| rig.img.blocks(l))
                .max()
                .unwrap();
            let k = rig.img.geometry(0).per_block as usize;
            let mut gpu_ffn =
                GpuStreamedFfn::new(&gpu, model, dim, max_blocks, k, 2, rig.slots).unwrap();
            gpu_ffn.timeout = Duration::from_millis(200);
            let mut rng = Rng(99);
            let order0 = random_order(&mut rng, rig.img.blocks(0), 0.5);
            let bad = rig.base[0] + order0[order0.len() / 2];
            let fault = Fault {
                block: bad,
                attempts: u32::MAX,
                kind,
            };
            with_lanes(&mut rig, &[fault], |img, base, lanes, file, cache, view| {
                let x: Vec<f32> = (0..dim).map(|_| rng.unit()).collect();
                let mut out = vec![0f32; dim];
                let t = Instant::now();
                fn req<'r>(
                    img: &'r FlashImage,
                    file: FileId,
                    base: &[BlockId],
                    l: usize,
                    order: &'r [u32],
                ) -> LayerBlocks<'r> {
                    LayerBlocks {
                        image: img,
                        file,
                        layer: l,
                        base: base[l],
                        order,
                        means: 0,
                    }
                }
                let e = gpu_ffn.forward_layer(
                    &gpu,
                    view,
                    req(img, file, base, 0, &order0),
                    2,
                    &x,
                    0.0,
                    lanes,
                    cache,
                    &mut |_, _, _, _| {},
                    &mut out,
                );
                let took = t.elapsed();
                eprintln!("gpu stream {name} {model:?} {kind:?}: {e:?} after {took:?}");
                match (kind, e) {
                    (FaultKind::Eio, Err(GpuStreamError::Read(r))) => {
                        assert_eq!(r.block, bad);
                        assert!(matches!(r.kind, ReadErrorKind::Io(5)), "{:?}", r.kind);
                    }
                    (FaultKind::Delay(_), Err(GpuStreamError::Missing { block })) => {
                        assert_eq!(block, bad)
                    }
                    (_, e) => panic!("{kind:?}: {e:?}"),
                }
                assert!(took < Duration::from_secs(5), "gave up only after {took:?}");
                // The next layer streams as usual.
                let l = 1.min(img.layers() - 1);
                let order = random_order(&mut rng, img.blocks(l), 0.5);
                let order: Vec<u32> = order.into_iter().filter(|&b| base[l] + b != bad).collect();
                gpu_ffn
                    .forward_layer(
                        &gpu,
                        view,
                        req(img, file, base, l, &order),
                        2,
                        &x,
                        0.0,
                        lanes,
                        cache,
                        &mut |_, _, _, _| {},
                        &mut out,
                    )
                    .unwrap();
                let err = max_rel(&out, &cpu_layer(img, l, &order, &x, 0.0));
                assert!(err < 1e-4, "{model:?} {kind:?}: next layer off by {err}");
            });
        }
    }
}
