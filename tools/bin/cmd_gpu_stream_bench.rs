//! `leanstream gpu-stream-bench`: the GPU's streamed FFN (backend/cuda/stream_layer.rs) over a
//! flash image on this machine's disk, replaying block sets recorded from a real decode
//! (`stream-bench --record-sets`, possibly on another machine over the real model: a
//! same-geometry image replays them block for block). Per memory model and FFN budget: the
//! FFN's milliseconds per token over every layer, the cache's hit ratio and bytes read per
//! token, beside the same requests with the reads alone (no GPU) and with every block resident
//! (compute alone), so how much of the I/O the kernel hides shows. Each configuration is first
//! checked against the CPU's sum over the same blocks.

use super::*;

#[derive(Args)]
pub struct GpuStreamBenchArgs {
    /// The flash image (w8a8 or F16 blocks: `flash --precision w8a8`).
    #[arg(long)]
    image: PathBuf,
    /// The block sets to replay (`stream-bench --record-sets`).
    #[arg(long)]
    sets: PathBuf,
    /// FFN budgets in percent of the image's FFN bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,20,50,100")]
    budgets: Vec<f64>,
    /// Memory models, comma-separated: unified (the kernel reads the cache in mapped host
    /// memory, as on a Jetson) and discrete (device copies).
    #[arg(long, value_delimiter = ',', default_value = "unified,discrete")]
    memory: Vec<String>,
    /// The cache policy (lru, lfu).
    #[arg(long, default_value = "lru")]
    cache: String,
    /// Tokens replayed before measuring (the cache fills).
    #[arg(long, default_value_t = 8)]
    warm_tokens: usize,
    /// Tokens measured (at most what the sets hold after the warm ones).
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Stages per layer (Algorithm 1's prediction updates).
    #[arg(long, default_value_t = 4)]
    stages: usize,
    /// Markdown table output.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// JSON output.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[cfg(not(feature = "cuda"))]
pub fn cmd_gpu_stream_bench(_: GpuStreamBenchArgs) -> Result<(), String> {
    Err("this build has no CUDA backend (built without the cuda feature)".into())
}

#[cfg(feature = "cuda")]
pub fn cmd_gpu_stream_bench(a: GpuStreamBenchArgs) -> Result<(), String> {
    gpu::run(a)
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use leanstream::backend::cuda::driver::Gpu;
    use leanstream::backend::cuda::stream_layer::{
        CacheMemory, CacheView, GpuStreamedFfn, LayerBlocks,
    };
    use leanstream::board::MemoryModel;
    use leanstream::model::flash::FlashImage;
    use leanstream::stream::{
        flags_from_words, BlockId, BlockRead, FileId, LaneConfig, Lanes, Policy, RequestError,
        Requested, WeightCache,
    };
    use leanstream_tools::bench::ffn_ref::{block_ffn, max_rel};
    use leanstream_tools::bench::sets::BlockSets;
    use std::time::Instant;

    /// The parity gate a configuration must pass before it is timed.
    const GATE: f32 = 1e-3;

    #[derive(serde::Serialize)]
    struct Row {
        memory: String,
        config: String,
        budget: f64,
        ffn_ms_per_token: f64,
        hit_ratio: f64,
        mib_read_per_token: f64,
        reads_alone_ms_per_token: f64,
        parity: f32,
    }

    struct Shape {
        dim: usize,
        base: Vec<BlockId>,
        total: usize,
        max_blocks: usize,
        max_k: usize,
        slot_bytes: usize,
    }

    fn shape(img: &FlashImage) -> Shape {
        let mut base = vec![0];
        for l in 0..img.layers() {
            base.push(base[l] + img.blocks(l) as BlockId);
        }
        let layers = 0..img.layers();
        Shape {
            dim: img.geometry(0).dim as usize,
            total: *base.last().unwrap() as usize,
            base,
            max_blocks: layers.clone().map(|l| img.blocks(l)).max().unwrap_or(0),
            max_k: layers
                .clone()
                .map(|l| img.geometry(l).per_block as usize)
                .max()
                .unwrap_or(1),
            slot_bytes: layers
                .map(|l| img.geometry(l).block_bytes as usize)
                .max()
                .unwrap_or(0),
        }
    }

    /// xorshift64*: the layers' inputs, the same for every configuration.
    fn inputs(layers: usize, dim: usize) -> Vec<Vec<f32>> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        (0..layers)
            .map(|_| {
                (0..dim)
                    .map(|_| {
                        s ^= s >> 12;
                        s ^= s << 25;
                        s ^= s >> 27;
                        let r = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
                        (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                    })
                    .collect()
            })
            .collect()
    }

    /// One configuration's cache, lanes and GPU side.
    struct Rig {
        mem: CacheMemory,
        staging: leanstream::backend::cuda::driver::MappedHost,
        flags: Vec<u32>,
        slots: usize,
        cfg: LaneConfig,
    }

    impl Rig {
        fn new(gpu: &Gpu, s: &Shape, model: MemoryModel, slots: usize) -> Result<Rig, String> {
            let cfg = LaneConfig::from_board(s.slot_bytes);
            let stride = s.slot_bytes.next_multiple_of(64);
            let cuda = |e: leanstream::backend::cuda::driver::CudaError| e.to_string();
            Ok(Rig {
                mem: CacheMemory::new(gpu, model, slots * stride).map_err(cuda)?,
                staging: gpu.alloc_mapped(cfg.staging_bytes()).map_err(cuda)?,
                flags: vec![0; s.total],
                slots,
                cfg,
            })
        }

        /// Runs `body` over this rig's cache and lanes on `image`.
        fn with<R>(
            &mut self,
            image: &Path,
            s: &Shape,
            policy: Policy,
            body: impl FnOnce(&mut Lanes, FileId, &mut WeightCache, CacheView) -> Result<R, String>,
        ) -> Result<R, String> {
            let (arena, view) = self.mem.split();
            let flags = flags_from_words(&mut self.flags);
            let mut cache =
                WeightCache::new(arena, s.slot_bytes, self.slots, policy, flags, &[], None)
                    .map_err(|e| e.to_string())?;
            let mut lanes =
                Lanes::with_best_backend(self.cfg, self.staging.as_mut_slice(), s.total)
                    .map_err(|e| e.to_string())?;
            let file = lanes.open(image).map_err(|e| e.to_string())?;
            if !lanes.is_direct(file) {
                eprintln!(
                    "note: O_DIRECT refused for {}: reading through the page cache",
                    image.display()
                );
            }
            body(&mut lanes, file, &mut cache, view)
        }
    }

    /// The layer-local blocks of step `t * layers + l`.
    fn order(sets: &BlockSets, s: &Shape, layers: usize, t: usize, l: usize, out: &mut Vec<u32>) {
        out.clear();
        out.extend(sets.steps[t * layers + l].iter().map(|&id| id - s.base[l]));
    }

    pub fn run(a: GpuStreamBenchArgs) -> Result<(), String> {
        let img = FlashImage::open(&a.image).map_err(|e| format!("{}: {e}", a.image.display()))?;
        img.check_board(leanstream::board::NAME)
            .map_err(|e| format!("{}: {e}", a.image.display()))?;
        let sets = BlockSets::read(&a.sets)?;
        sets.check_image(&img)
            .map_err(|e| format!("{}: {e}", a.sets.display()))?;
        let policy: Policy = a.cache.parse().map_err(|e| format!("--cache: {e}"))?;
        let layers = img.layers();
        let have = sets.steps.len() / layers.max(1);
        let tokens = a.tokens.min(have.saturating_sub(a.warm_tokens));
        if tokens == 0 {
            return Err(format!(
                "{}: {have} tokens recorded, none left after --warm-tokens {}",
                a.sets.display(),
                a.warm_tokens
            ));
        }
        let s = shape(&img);
        let xs = inputs(layers, s.dim);
        let gpu = Gpu::open(0).map_err(|e| e.to_string())?;
        let ffn_bytes: u64 = (0..layers)
            .map(|l| img.blocks(l) as u64 * img.geometry(l).block_bytes as u64)
            .sum();
        let mean_blocks =
            sets.steps.iter().map(Vec::len).sum::<usize>() as f64 / sets.steps.len().max(1) as f64;
        eprintln!(
            "{}: {layers} layers, {} blocks of up to {} bytes ({:.0} MiB of FFN); {} tokens recorded, {:.0} blocks per layer-step ({:.1}%); {}",
            a.image.display(),
            s.total,
            s.slot_bytes,
            ffn_bytes as f64 / (1 << 20) as f64,
            have,
            mean_blocks,
            100.0 * mean_blocks * layers as f64 / s.total as f64,
            gpu.name
        );
        // The largest layer's blocks plus every read in flight.
        let lanes = LaneConfig::from_board(s.slot_bytes);
        let min_slots = s.max_blocks + lanes.lanes * lanes.queue_depth;
        let mut rows = Vec::new();
        for m in &a.memory {
            let model = match m.as_str() {
                "unified" => MemoryModel::Unified,
                "discrete" => MemoryModel::Discrete,
                other => return Err(format!("--memory {other}: unified or discrete")),
            };
            // `None`: every block resident before the first token (compute alone).
            let configs = a
                .budgets
                .iter()
                .map(|&b| Some(b))
                .chain(std::iter::once(None));
            for budget in configs {
                let slots = match budget {
                    Some(b) => ((s.total as f64 * b / 100.0) as usize).min(s.total),
                    None => s.total,
                };
                let label = budget.map_or("all resident".to_string(), |b| format!("{b}%"));
                if slots < min_slots {
                    eprintln!(
                        "{m} {label}: not run: {slots} slots, below the {min_slots} the largest layer and the reads in flight need"
                    );
                    continue;
                }
                let row = run_one(
                    &a, &img, &sets, &s, &xs, &gpu, model, policy, slots, budget, tokens,
                )?;
                eprintln!(
                    "{m} {label}: FFN {:.2} ms/token, hit ratio {:.3}, {:.2} MiB read/token, reads alone {:.2} ms/token (parity {:.1e})",
                    row.ffn_ms_per_token, row.hit_ratio, row.mib_read_per_token, row.reads_alone_ms_per_token, row.parity
                );
                rows.push(Row {
                    memory: m.clone(),
                    config: label,
                    ..row
                });
            }
        }
        let mut md = format!(
            "FFN streamed on the GPU ({}), {} tokens replayed after {} warm, {} stages per layer, cache {}\n\n| memory | budget | FFN ms/token | hit ratio | MiB read/token | reads alone ms/token |\n|---|---:|---:|---:|---:|---:|\n",
            gpu.name, tokens, a.warm_tokens, a.stages, a.cache
        );
        for r in &rows {
            md.push_str(&format!(
                "| {} | {} | {:.2} | {:.3} | {:.2} | {:.2} |\n",
                r.memory,
                r.config,
                r.ffn_ms_per_token,
                r.hit_ratio,
                r.mib_read_per_token,
                r.reads_alone_ms_per_token
            ));
        }
        print!("{md}");
        if let Some(p) = &a.markdown {
            std::fs::write(p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        if let Some(p) = &a.json {
            let j = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
            std::fs::write(p, j).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        Ok(())
    }

    /// What one replay saw: ms per measured token, hit ratio, bytes read per token, parity.
    struct Replay {
        ms: f64,
        hit_ratio: f64,
        bytes: f64,
        parity: f32,
    }

    /// Everything a replay reads: the arguments, image, sets, shape and inputs.
    struct Job<'j> {
        a: &'j GpuStreamBenchArgs,
        img: &'j FlashImage,
        sets: &'j BlockSets,
        s: &'j Shape,
        xs: &'j [Vec<f32>],
        tokens: usize,
    }

    #[allow(clippy::too_many_arguments)]
    fn run_one(
        a: &GpuStreamBenchArgs,
        img: &FlashImage,
        sets: &BlockSets,
        s: &Shape,
        xs: &[Vec<f32>],
        gpu: &Gpu,
        model: MemoryModel,
        policy: Policy,
        slots: usize,
        budget: Option<f64>,
        tokens: usize,
    ) -> Result<Row, String> {
        let job = Job {
            a,
            img,
            sets,
            s,
            xs,
            tokens,
        };
        let cuda = |e: leanstream::backend::cuda::driver::CudaError| e.to_string();
        let mut ffn =
            GpuStreamedFfn::new(gpu, model, s.dim, s.max_blocks, s.max_k, a.stages, slots)
                .map_err(cuda)?;
        let mut rig = Rig::new(gpu, s, model, slots)?;
        let r = rig.with(&a.image, s, policy, |lanes, file, cache, view| {
            if budget.is_none() {
                preload(&job, lanes, file, cache)?;
            }
            replay(&job, gpu, &mut ffn, lanes, file, cache, view)
        })?;
        // The same requests with the reads alone: a fresh cache of the same size, no GPU.
        let reads_ms = match budget {
            None => 0.0,
            Some(_) => {
                let mut rig = Rig::new(gpu, s, model, slots)?;
                rig.with(&a.image, s, policy, |lanes, file, cache, _| {
                    replay_reads(&job, lanes, file, cache)
                })?
            }
        };
        Ok(Row {
            memory: String::new(),
            config: String::new(),
            budget: budget.unwrap_or(100.0),
            ffn_ms_per_token: r.ms,
            hit_ratio: r.hit_ratio,
            mib_read_per_token: r.bytes / (1 << 20) as f64,
            reads_alone_ms_per_token: reads_ms,
            parity: r.parity,
        })
    }

    fn read_of(img: &FlashImage, s: &Shape, file: FileId, l: usize, b: u32) -> BlockRead {
        let (offset, len) = img.block_extent(l, b as usize);
        BlockRead {
            file,
            offset,
            len: len as u32,
            block: s.base[l] + b,
        }
    }

    /// Every block read into the cache before the first token: what is left is compute.
    fn preload(
        job: &Job,
        lanes: &mut Lanes,
        file: FileId,
        cache: &mut WeightCache,
    ) -> Result<(), String> {
        let io = |e: std::io::Error| e.to_string();
        for l in 0..job.img.layers() {
            for b in 0..job.img.blocks(l) as u32 {
                let read = read_of(job.img, job.s, file, l, b);
                while let Err(e) = lanes.prefetch(read, 1.0, cache) {
                    if !matches!(e, RequestError::Full { .. }) {
                        return Err(e.to_string());
                    }
                    lanes.wait_next(cache).map_err(io)?;
                }
            }
        }
        while lanes.wait_next(cache).map_err(io)?.is_some() {}
        Ok(())
    }

    /// The recorded tokens through the GPU's streamed FFN, layer by layer; the first token's
    /// first and last layers checked against the CPU before the rest is timed.
    fn replay(
        job: &Job,
        gpu: &Gpu,
        ffn: &mut GpuStreamedFfn,
        lanes: &mut Lanes,
        file: FileId,
        cache: &mut WeightCache,
        view: CacheView,
    ) -> Result<Replay, String> {
        let (a, s) = (job.a, job.s);
        let layers = job.img.layers();
        let mut ord = Vec::with_capacity(s.max_blocks);
        let mut out = vec![0f32; s.dim];
        let mut parity = 0f32;
        let (mut hits, mut blocks, mut bytes0, mut t0) = (0, 0, 0, Instant::now());
        for t in 0..a.warm_tokens + job.tokens {
            if t == a.warm_tokens {
                (hits, blocks) = (0, 0);
                bytes0 = cache.stats().bytes_read;
                t0 = Instant::now();
            }
            for (l, x) in job.xs.iter().enumerate() {
                order(job.sets, s, layers, t, l, &mut ord);
                let req = LayerBlocks {
                    image: job.img,
                    file,
                    layer: l,
                    base: s.base[l],
                    order: &ord,
                    means: 0,
                };
                let mut no_update = |_: usize, _: &[f32], _: &mut Lanes, _: &mut WeightCache| {};
                let st = ffn
                    .forward_layer(
                        gpu,
                        view,
                        req,
                        a.stages,
                        x,
                        0.0,
                        lanes,
                        cache,
                        &mut no_update,
                        &mut out,
                    )
                    .map_err(|e| format!("token {t} layer {l}: {e}"))?;
                hits += st.hits;
                blocks += st.blocks;
                if t == 0 && (l == 0 || l + 1 == layers) {
                    let err = max_rel(&out, &block_ffn(job.img, l, &ord, x, 0.0));
                    parity = parity.max(err);
                    if err > GATE {
                        return Err(format!(
                            "layer {l}: GPU off the CPU by {err:.2e} (gate {GATE:.0e}): not timed"
                        ));
                    }
                }
            }
        }
        Ok(Replay {
            ms: t0.elapsed().as_secs_f64() * 1e3 / job.tokens as f64,
            hit_ratio: hits as f64 / blocks.max(1) as f64,
            bytes: (cache.stats().bytes_read - bytes0) as f64 / job.tokens as f64,
            parity,
        })
    }

    /// The same layer-steps' requests with the reads alone (each layer's blocks pinned until
    /// its reads are all in, as the GPU's layer holds them): ms per measured token.
    fn replay_reads(
        job: &Job,
        lanes: &mut Lanes,
        file: FileId,
        cache: &mut WeightCache,
    ) -> Result<f64, String> {
        let (a, s) = (job.a, job.s);
        let layers = job.img.layers();
        let io = |e: std::io::Error| e.to_string();
        let mut ord = Vec::with_capacity(s.max_blocks);
        let mut pinned: Vec<BlockId> = Vec::with_capacity(s.max_blocks);
        fn hold(cache: &mut WeightCache, pinned: &mut Vec<BlockId>, block: BlockId) {
            cache.pin(block);
            pinned.push(block);
        }
        let mut t0 = Instant::now();
        for t in 0..a.warm_tokens + job.tokens {
            if t == a.warm_tokens {
                t0 = Instant::now();
            }
            for l in 0..layers {
                order(job.sets, s, layers, t, l, &mut ord);
                let n = ord.len();
                for (i, &b) in ord.iter().enumerate() {
                    let read = read_of(job.img, s, file, l, b);
                    loop {
                        match lanes.request(read, (n - i) as f32, cache) {
                            Ok(Requested::Cached(_)) => {
                                hold(cache, &mut pinned, read.block);
                                break;
                            }
                            Ok(_) => break,
                            Err(e) if !matches!(e, RequestError::Full { .. }) => {
                                return Err(e.to_string())
                            }
                            // The lanes are full: take in a finished read to make room.
                            Err(_) => {
                                if let Some(a) = lanes.wait_next(cache).map_err(io)? {
                                    if a.result.is_ok() {
                                        hold(cache, &mut pinned, a.block);
                                    }
                                }
                            }
                        }
                    }
                }
                while let Some(a) = lanes.wait_next(cache).map_err(io)? {
                    if a.result.is_ok() {
                        hold(cache, &mut pinned, a.block);
                    }
                }
                for &id in pinned.iter() {
                    cache.unpin(id);
                }
                pinned.clear();
            }
        }
        Ok(t0.elapsed().as_secs_f64() * 1e3 / job.tokens as f64)
    }
}
