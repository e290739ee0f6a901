//! The CUDA decoder's boot (`CudaEngine::boot_with`), apart from the decode step it sets up
//! (engine/cuda.rs): the weight image planned and checked against the board's budgets, the KV
//! cache, the activations, the batched prefill's buffers and the streamed FFN's, each carved
//! or allocated once; then the weights written, the kernels chosen and the step captured.

use super::*;
use crate::kv::KvPrecision;

impl<'a> CudaEngine<'a> {
    /// Boots `model` on the GPU: whole, or its dense part with the FFN streamed (`streamed`).
    pub(super) fn boot_with(
        arenas: &'a mut Arenas,
        model: &ModelFile,
        opts: CudaOptions,
        streamed: Option<StreamedBoot<'_>>,
    ) -> Result<CudaEngine<'a>, EngineError> {
        let h = model.hyper()?;
        match streamed {
            Some(_) => model.validate_dense(&h)?,
            None => model.validate(&h)?,
        }
        // A streamed FFN: its image, checked, and the oracle's resident gate and up rows.
        let streamed = match streamed {
            Some(sb) => Some(stream::Prepared::new(sb, &h)?),
            None => None,
        };
        let q_dim = h.n_heads * h.head_dim;
        let kv_dim = h.n_kv_heads * h.head_dim;
        if h.head_dim % 4 != 0 || h.head_dim > 256 || h.n_heads % h.n_kv_heads != 0 {
            return Err(EngineError::Unsupported(format!(
                "the CUDA backend needs a head_dim that is a multiple of 4, at most 256, and n_heads a multiple of n_kv_heads (head_dim {}, heads {}/{})",
                h.head_dim, h.n_heads, h.n_kv_heads
            )));
        }
        // The same KV plan as the CPU decoder's (`engine::kv_plan`), at the GPU's head limit.
        let (shape, kv_precision) = crate::engine::kv_plan(
            &h,
            opts.context,
            opts.precision,
            opts.kv,
            INT8_KV_MAX_HEAD_DIM,
        );
        let context = shape.context;
        let mut gpu = Gpu::open(0)?;
        // Dependent launch needs sm_90 (and the compute_90 PTX that `ptx_for` then picks).
        let dependent_launch = if gpu.compute_capability.0 >= 9 {
            opts.dependent_launch
        } else {
            DependentLaunch::Off
        };
        gpu.dependent_launch = dependent_launch != DependentLaunch::Off;
        // The products' pull of the next one's weights: a bulk prefetch (sm_90), of weights in
        // device memory (in mapped host memory the bus sets the pace, and a second stream of
        // reads over it would only compete), for the FFN in memory.
        let prefetch_ahead = match opts.prefetch_ahead {
            _ if gpu.compute_capability.0 < 9 => 0,
            _ if streamed.is_some() || opts.memory != MemoryModel::Discrete => 0,
            Some(bytes) => bytes,
            None => gpu.l2_bytes.max(0) as usize / PREFETCH_AHEAD_L2_SHARE,
        };

        // Plan the weight image (same code as the write pass, without writing).
        let build = |w: &mut ImageWriter| write_image(w, model, &h, streamed.as_ref());
        let mut plan = ImageWriter::plan();
        plan.precision = opts.precision;
        let (_, _, _, planned_layers) = build(&mut plan)?;
        let image_bytes = plan.len;
        let conversions = std::mem::take(&mut plan.report);

        let mut need = Plan::default();
        match &streamed {
            // The FFN's budget is the weight cache's; the oracle's resident rows are kept
            // outside the board's budgets, as the CPU keeps them (a bound, not a product).
            Some(p) => {
                need.add_bytes(image_bytes.saturating_sub(p.resident_bytes()));
                need.check(
                    ArenaKind::DenseWeights,
                    arenas.dense.len(),
                    "the GPU weight image's dense part (the FFN streams)",
                )?;
            }
            None => {
                need.add_bytes(image_bytes);
                need.check(
                    ArenaKind::DenseWeights,
                    arenas.dense.len() + arenas.ffn.len(),
                    "the GPU weight image (dense and FFN budgets together)",
                )?;
            }
        }
        let groups = h.head_dim / 32;
        let int8_kv = kv_precision == KvPrecision::I8;
        let kv_bytes = h.n_layers * context * kv_dim * kv_precision.value_bytes();
        let kv_scale_bytes = if int8_kv {
            h.n_layers * context * h.n_kv_heads * groups * 4
        } else {
            0
        };
        let key_scale_bytes = if int8_kv && h.qkv_bias {
            h.n_layers * kv_dim * 4
        } else {
            0
        };
        let mut kv = Plan::default();
        kv.add_bytes(2 * (kv_bytes + kv_scale_bytes) + key_scale_bytes);
        kv.check(
            ArenaKind::Kv,
            arenas.kv.len(),
            &format!("the {} KV cache for {context} tokens", kv_precision.name()),
        )?;
        // Batched prefill needs the FFN in memory (a streamed one runs prompts token by token).
        let prefill_batch = match streamed {
            None if opts.prefill_batch > 1 => opts.prefill_batch.min(context),
            _ => 0,
        };
        // cuBLAS's workspace and scratch where it is asked for and loads (PTX products else).
        let prefill_blas = if prefill_batch > 0
            && opts.prefill_products == PrefillProducts::Blas
            && crate::backend::cuda::blas::Blas::present()
        {
            let mats = planned_layers.iter().flat_map(|l| {
                let (_, qkv, _, wo, _, (gate_up, _), down) = l;
                qkv.iter()
                    .chain(gate_up.iter())
                    .map(|(m, _)| m)
                    .chain([wo])
                    .chain(down.iter())
            });
            prefill::blas_bytes(gpu.compute_capability, mats)
        } else {
            [0, 0]
        };
        let prefill_bytes = if prefill_batch > 0 {
            PrefillBuffers::of(&h, prefill_batch, prefill_blas).bytes()
        } else {
            0
        };
        // The activation budget holds the host's logits and sampler buffer, and the device's
        // prefill chunk.
        let mut host = Plan::default();
        host.add::<f32>(h.vocab_size);
        host.add::<u32>(h.vocab_size);
        host.add_bytes(prefill_bytes);
        host.check(
            ArenaKind::ActivationScratch,
            arenas.scratch.len(),
            &format!(
                "the host logits and sampler buffer and a GPU prefill chunk of {prefill_batch} tokens"
            ),
        )?;
        let (free, _) = gpu.memory().map_err(cuda)?;
        let device_need = 2 * (kv_bytes + kv_scale_bytes)
            + key_scale_bytes
            + prefill_bytes
            + if opts.memory == MemoryModel::Unified {
                0
            } else {
                image_bytes
            };
        if device_need > free {
            return Err(EngineError::Gpu(format!(
                "the GPU has {free} bytes free and this model needs {device_need}"
            )));
        }

        // Write the image where the GPU will read it.
        let (weights, base, layout) = match opts.memory {
            MemoryModel::Unified => {
                let mut m = gpu.alloc_mapped(image_bytes).map_err(cuda)?;
                let mut w = ImageWriter::write_into(m.as_mut_slice());
                w.precision = opts.precision;
                let l = build(&mut w)?;
                let base = m.dev;
                (WeightMemory::Mapped(m), base, l)
            }
            _ => {
                let mut staging = vec![0u8; image_bytes];
                let mut w = ImageWriter::write_into(&mut staging);
                w.precision = opts.precision;
                let l = build(&mut w)?;
                let buf = gpu.alloc(image_bytes).map_err(cuda)?;
                gpu.upload(buf.ptr, &staging).map_err(cuda)?;
                let base = buf.ptr;
                (WeightMemory::Device(buf), base, l)
            }
        };
        let (embd_l, output_l, output_norm_off, layer_ls) = layout;
        let at = |off: usize| base + off as u64;
        let mat = |l: &MatLayout| Mat {
            ty: l.ty,
            rows: l.rows,
            cols: l.cols,
            q: at(l.q),
            d: if l.d == usize::MAX { 0 } else { at(l.d) },
            m: if l.m == usize::MAX { 0 } else { at(l.m) },
            qh: if l.qh == usize::MAX { 0 } else { at(l.qh) },
            bytes: l.bytes,
        };
        let grp = |g: &heapless::Vec<(MatLayout, usize), 3>| -> MatGroup {
            g.iter().map(|(l, off)| (mat(l), *off)).collect()
        };
        let mut bytes_per_token = output_l.bytes;
        let mut int8_activations = output_l.ty.int8_activations();
        let mut layers = Vec::with_capacity(h.n_layers);
        for (norm, qkv, bias, wo, ffn_norm, (gate_up, gate_up_tiled), down) in &layer_ls {
            int8_activations |= [Some(wo), down.as_ref()]
                .into_iter()
                .flatten()
                .chain(qkv.iter().chain(gate_up).map(|(l, _)| l))
                .any(|l| l.ty.int8_activations());
            // A streamed FFN's bytes are the lanes' (the stream's statistics count them).
            bytes_per_token += qkv.iter().map(|(l, _)| l.bytes).sum::<usize>() + wo.bytes;
            if let Some(down) = down {
                bytes_per_token += gate_up.iter().map(|(l, _)| l.bytes).sum::<usize>() + down.bytes;
            }
            layers.push(GpuLayer {
                attn_norm: at(*norm),
                qkv: grp(qkv),
                qkv_bias: bias.map(at).unwrap_or(0),
                wo: mat(wo),
                ffn_norm: at(*ffn_norm),
                gate_up: grp(gate_up),
                gate_up_tiled: *gate_up_tiled,
                down: down.as_ref().map(mat),
            });
        }

        let ptx = ptx_for("decode", gpu.compute_capability).ok_or_else(|| {
            EngineError::Unsupported("no decode PTX embedded in this build".into())
        })?;
        let module = gpu.load_module(ptx).map_err(cuda)?;
        let f = |n: &str| module.function(n).map_err(cuda);
        // A type's product kernels (f32 has no wide one; mv_config never asks).
        let kernels_of = |ty: GpuType| -> Result<[Function; 4], EngineError> {
            let stem = type_slot(ty).1;
            let kernel = |wide: bool, prep: bool| {
                let wide = if wide && ty != GpuType::F32 {
                    "_wide"
                } else {
                    ""
                };
                let prep = if prep { "_prep" } else { "" };
                f(&format!("matvec_{stem}{wide}{prep}"))
            };
            Ok([
                kernel(false, false)?,
                kernel(true, false)?,
                kernel(false, true)?,
                kernel(true, true)?,
            ])
        };
        let k = Kernels {
            embed: f("embed")?,
            add_norm: f("add_norm")?,
            attention: f(match kv_precision {
                KvPrecision::F32 => "attention",
                KvPrecision::F16 => "attention_f16",
                KvPrecision::I8 => "attention_i8",
            })?,
            attention_cluster: f(match kv_precision {
                KvPrecision::F32 => "attention_cluster",
                KvPrecision::F16 => "attention_f16_cluster",
                KvPrecision::I8 => "attention_i8_cluster",
            })?,
            matvec: [
                kernels_of(GpuType::F32)?,
                kernels_of(GpuType::F16)?,
                kernels_of(GpuType::Q8_0)?,
                kernels_of(GpuType::Q4_0)?,
                kernels_of(GpuType::Q4_1)?,
                kernels_of(GpuType::Q5_0)?,
                kernels_of(GpuType::Q5_1)?,
                kernels_of(GpuType::Q4_K)?,
                kernels_of(GpuType::Q5_K)?,
                kernels_of(GpuType::Q6_K)?,
            ],
        };

        check_product_tpr(&opts.product_tpr).map_err(EngineError::Unsupported)?;

        // The attention kernel quantizes its output per head, in blocks of 32 that must not
        // cross heads.
        if layers.iter().any(|l| l.wo.ty.int8_activations()) && h.head_dim % 32 != 0 {
            return Err(EngineError::Unsupported(format!(
                "the CUDA backend reads a quantized attention output matrix with int8 activations only when head_dim is a multiple of 32 (it is {})",
                h.head_dim
            )));
        }

        // An attention block rotates q and k and copies v one or two items a thread, and
        // quantizes an int8 cache's k, v and q a warp a group of 32 (attention.cuh's `attend`).
        let l2_bytes = gpu.l2_bytes.max(0) as usize;
        let threads = attention::attention_threads(&h, kv_precision, l2_bytes, context, &opts);
        if !attention::block_holds_head(h.head_dim, int8_kv, threads) {
            return Err(EngineError::Unsupported(format!(
                "decode attention in blocks of {threads} threads: a multiple of 32 up to 1024 and at least {} for heads of {}{}",
                2 * h.head_dim,
                h.head_dim,
                if int8_kv {
                    format!(" ({} with the int8 cache)", 32 * attention::int8_warps(h.head_dim))
                } else {
                    String::new()
                }
            )));
        }
        let attention_per_sm = gpu
            .blocks_per_sm(k.attention, threads as u32, 0)
            .map_err(cuda)?;
        let split = AttentionSplit::plan(
            (gpu.sm_count as usize * attention_per_sm as usize, threads),
            l2_bytes,
            &h,
            kv_precision,
            &opts,
        );
        // Clusters where the GPU has them; the driver's count of clusters that run at once
        // decides their size (a failed query: none).
        let split = if opts.cluster_attention && gpu.compute_capability.0 >= 9 {
            let c = attention::cluster_size(split.max_slices, h.n_heads, |c| {
                gpu.max_active_clusters(k.attention_cluster, threads as u32, c as u32)
                    .map_or(0, |n| n as usize)
            });
            split.with_cluster(
                c,
                opts.attention_slice,
                opts.cluster_until,
                (h.n_heads, h.n_kv_heads),
            )
        } else {
            split
        };

        // Activations: one device buffer carved into aligned slices (zeroed: the counters).
        // xf/xq hold the inputs of q/k/v, wo and the logits; hf/hq down's.
        let widest = h.dim.max(q_dim);
        let out_grid = mv_config(
            &mat(&output_l),
            gpu.sm_count as usize,
            opts.products,
            ProductRole::Output,
            opts.product_tpr[ProductRole::Output as usize],
        )
        .grid;
        let sizes = [
            h.dim * 4,                                    // x
            (q_dim + 2 * kv_dim) * 4,                     // qkv
            2 * h.hidden_dim * 4,                         // gu
            h.vocab_size * 4,                             // logits
            8,                                            // state
            widest * 4,                                   // xf
            widest + 8 * widest.div_ceil(32),             // xq: int8, then f32 scales and i32 sums
            4,                                            // counter
            8 * out_grid,                                 // part
            4 * h.hidden_dim.div_ceil(SWIGLU_TILE),       // swiglu_tiles
            h.hidden_dim * 4,                             // hf
            h.hidden_dim + 8 * h.hidden_dim.div_ceil(32), // hq
            4 * split.parts(&h) * (h.head_dim + 2),       // apart
            4 * h.n_heads,                                // acount
        ];
        let (buf, ptrs) = alloc_carved(&gpu, sizes)?;
        let [x, qkv, gu, logits, state, xf, xq, counter, part, swiglu_tiles, hf, hq, apart, acount] =
            ptrs;
        let a = Activations {
            _buf: buf,
            x,
            qkv,
            gu,
            logits,
            state,
            xf,
            xq: if int8_activations { xq } else { 0 },
            hf,
            hq: if int8_activations { hq } else { 0 },
            counter,
            part,
            swiglu_tiles,
            apart,
            acount,
        };
        let scales = |n: usize| -> Result<Option<DeviceBuffer>, EngineError> {
            Ok(if n > 0 {
                Some(gpu.alloc(n).map_err(cuda)?)
            } else {
                None
            })
        };
        let kv = GpuKv {
            k: gpu.alloc(kv_bytes).map_err(cuda)?,
            v: gpu.alloc(kv_bytes).map_err(cuda)?,
            k_scales: scales(kv_scale_bytes)?,
            v_scales: scales(kv_scale_bytes)?,
            key_scale: scales(key_scale_bytes)?,
        };
        if let Some(buf) = &kv.key_scale {
            upload_f32(&gpu, buf.ptr, &key_scales(model, &h)?).map_err(cuda)?;
        }
        let host_tokens = gpu.alloc_mapped(4 * context).map_err(cuda)?;

        let mut c = arenas.scratch.carver();
        let logits_host = c.take::<f32>(h.vocab_size)?;
        let sample_idx = Some(c.take::<u32>(h.vocab_size)?);
        let timeline = match opts.timeline {
            true => Some(timeline::Timeline::boot(&gpu, h.n_layers).map_err(cuda)?),
            false => None,
        };
        // Every layer's gate/up has the same shape: the first one's launch stands for all.
        let gate_up_blocks = layers
            .first()
            .and_then(|l| l.gate_up.first())
            .map(|(m, _)| {
                let role = ProductRole::GateUp;
                let tpr = opts.product_tpr[role as usize];
                mv_config(m, gpu.sm_count as usize, opts.products, role, tpr).grid
            });
        let norm_tail_for = norm_tail_for(&opts, gate_up_blocks);
        let swiglu_cluster = opts.swiglu_cluster && gpu.compute_capability.0 >= 9;
        let mut e = CudaEngine {
            gpu,
            _module: module,
            k,
            hyper: h,
            context,
            memory: opts.memory,
            precision: opts.precision,
            weight_bytes_per_token: bytes_per_token,
            conversions,
            int8_activations,
            _weights: weights,
            embd: mat(&embd_l),
            output: mat(&output_l),
            output_norm: at(output_norm_off),
            layers,
            a,
            kv,
            kv_precision,
            host_tokens,
            step: Box::new([0, 0]),
            logits_host,
            sample_idx,
            graph: None,
            products: opts.products,
            product_tpr: opts.product_tpr,
            // A streamed FFN hands its output back through `add_norm`, which prepares the
            // next product's input: the products read it prepared.
            in_block_norm: match opts.in_block_norm {
                _ if streamed.is_some() => false,
                InBlockNorm::Auto => h.dim <= IN_BLOCK_NORM_MAX_DIM,
                InBlockNorm::Always => true,
                InBlockNorm::Never => false,
            },
            norm_tail_for,
            prefetch: opts.prefetch && streamed.is_none(),
            prefetch_ahead,
            repeat_product: opts.repeat_product,
            swiglu_cluster,
            timeline,
            split,
            attention_slice: opts.attention_slice,
            pdl: pdl_kernel_mode(dependent_launch),
            device_state: None,
            stream: None,
            prefill: None,
        };
        if prefill_batch > 0 {
            e.prefill = Some(prefill::Prefill::boot(
                &e.gpu,
                &e.hyper,
                context,
                prefill_batch,
                prefill_blas,
                opts.prefill_tensor_attention,
            )?);
        }
        if let Some(p) = streamed {
            let (n_flags, n_staging) = (arenas.flags.len() / 4, arenas.io_staging.len());
            let flags = arenas.flags.carver().take::<u32>(n_flags)?;
            let staging = arenas.io_staging.carver().take::<u8>(n_staging)?;
            let s = stream::GpuStream::boot(&e, p, arenas.ffn.len(), flags, staging, &mut c)?;
            e.stream = Some(s);
        }
        // A streamed step returns to the host at every layer: no graph.
        if opts.graph && e.stream.is_none() {
            let g = e.gpu.capture(|| e.record_step()).map_err(cuda)?;
            e.graph = Some(g);
        }
        e.gpu.sync().map_err(cuda)?;
        Ok(e)
    }
}

/// Gate/up launches of more blocks than this read the residual normed by the tail of the
/// product before even where the other products norm it in each block: every block of an
/// in-block norm reads and norms the whole residual before its first weight. Measured on an
/// H100 (docs/HIL.md round 43, and round 4 for the 7B shape): the tail gains at the 1.5B
/// shape's F16 gate/up (2,240 blocks, +3.5%, alternated) and the 7B shape's (1,376 blocks, all
/// three types); in-block gains at 560 (1.5B Q4_0 and Q8_0, 2-4%) and 192 (SmolLM2 F16, 9%),
/// and is level or ahead at 608 (0.5B F16).
const GATE_UP_NORM_TAIL_BLOCKS: usize = 1024;

/// The roles whose products read the residual normed once by the tail of the product before,
/// where the others norm it in each block (`CudaEngine::normed`): the ones asked for
/// (`CudaOptions::norm_tail_for`), and by the engine's choice (`InBlockNorm::Auto`) a gate/up
/// of more than `GATE_UP_NORM_TAIL_BLOCKS` blocks. (A Q4_0 head of 2,374 blocks was level
/// either way, round 43.)
fn norm_tail_for(
    opts: &CudaOptions,
    gate_up_blocks: Option<usize>,
) -> [bool; ProductRole::ALL.len()] {
    let mut tail = opts.norm_tail_for;
    if opts.in_block_norm == InBlockNorm::Auto {
        tail[ProductRole::GateUp as usize] |=
            gate_up_blocks.is_some_and(|b| b > GATE_UP_NORM_TAIL_BLOCKS);
    }
    tail
}

/// The int8 cache's key channel scales of a model with a K bias, n_layers x kv_dim, made as
/// the CPU boot makes them (`kv::key_scales_from_bias`), so both divide the same keys.
fn key_scales(model: &ModelFile, h: &Hyper) -> Result<Vec<f32>, EngineError> {
    let kv_dim = h.n_kv_heads * h.head_dim;
    let half = h.head_dim / 2;
    let mut out = vec![0f32; h.n_layers * kv_dim];
    let mut bias = vec![0f32; kv_dim];
    for (l, o) in out.chunks_exact_mut(kv_dim).enumerate() {
        let t = model.tensor(&format!("blk.{l}.attn_k.bias"))?;
        crate::model::ggml::dequantize_row(t.ty, t.data, &mut bias);
        crate::kv::key_scales_from_bias(&bias, h.head_dim, |i| h.rope_style.pair(i, half), o);
    }
    Ok(out)
}

/// A layer's place in the image: attention norm, q/k/v, their bias, wo, FFN norm, gate/up
/// (and whether stacked tile by tile), down (None when the FFN streams).
type LayerLayout = (
    usize,
    heapless::Vec<(MatLayout, usize), 3>,
    Option<usize>,
    MatLayout,
    usize,
    (heapless::Vec<(MatLayout, usize), 3>, bool),
    Option<MatLayout>,
);

/// Writes (or plans, with `ImageWriter::plan`) the weight image: the embedding, the output
/// matrix when not tied, the output norm, then the layers, each in the order the step reads
/// it. Returns the embedding's, the output's and the output norm's places and the layers'.
fn write_image(
    w: &mut ImageWriter,
    model: &ModelFile,
    h: &Hyper,
    streamed: Option<&stream::Prepared>,
) -> Result<(MatLayout, MatLayout, usize, Vec<LayerLayout>), EngineError> {
    let layer = |i: usize, n: &str| model.tensor(&format!("blk.{i}.{n}"));
    // A layer matrix's role (`quant::Role::of`: w4a8's policy, the CPU boot's too).
    let role = |i: usize, n: &str| Role::of(&format!("blk.{i}.{n}"), h.n_layers);
    let embd = w.matrix(&[model.tensor("token_embd.weight")?], Role::EmbedOrOutput);
    let output = if h.tied_output {
        embd
    } else {
        w.matrix(&[model.tensor("output.weight")?], Role::EmbedOrOutput)
    };
    let output_norm = w.vector(&[model.tensor("output_norm.weight")?]);
    let mut layers = Vec::with_capacity(h.n_layers);
    for i in 0..h.n_layers {
        // Written in the order the step reads them (attention norm, q/k/v and their bias,
        // wo, FFN norm, gate/up, down), so a layer's reads run up one span of addresses:
        // the attention launch's pull into L2 (`prefetch_after_attention`) takes one.
        let attn_norm = w.vector(&[layer(i, "attn_norm.weight")?]);
        let qkv = [
            layer(i, "attn_q.weight")?,
            layer(i, "attn_k.weight")?,
            layer(i, "attn_v.weight")?,
        ];
        let qkv = group(w, &qkv, role(i, "attn_q.weight"));
        let bias = if h.qkv_bias {
            Some(w.vector(&[
                layer(i, "attn_q.bias")?,
                layer(i, "attn_k.bias")?,
                layer(i, "attn_v.bias")?,
            ]))
        } else {
            None
        };
        let wo = w.matrix(
            &[layer(i, "attn_output.weight")?],
            role(i, "attn_output.weight"),
        );
        let ffn_norm = w.vector(&[layer(i, "ffn_norm.weight")?]);
        // Gate and up: the file's, or with a streamed FFN the oracle's resident rows
        // (none for a learned predictor); down only in memory.
        let gate_up_rows = match &streamed {
            Some(p) => p.resident_gate_up(i),
            None => Some([layer(i, "ffn_gate.weight")?, layer(i, "ffn_up.weight")?]),
        };
        let gate_role = role(i, "ffn_gate.weight");
        let (gate_up, tiled) = match gate_up_rows {
            None => (heapless::Vec::new(), false),
            Some([gate, up]) => {
                let tiled = gate.ty == up.ty
                    && gate.cols == up.cols
                    && gate.rows == up.rows
                    && gate.rows.is_multiple_of(SWIGLU_TILE);
                if tiled {
                    let mut g = heapless::Vec::new();
                    let _ = g.push((w.gate_up_tiled(gate, up, gate_role), 0));
                    (g, true)
                } else {
                    (group(w, &[gate, up], gate_role), false)
                }
            }
        };
        let down = match &streamed {
            Some(_) => None,
            None => Some(w.matrix(&[layer(i, "ffn_down.weight")?], role(i, "ffn_down.weight"))),
        };
        layers.push((attn_norm, qkv, bias, wo, ffn_norm, (gate_up, tiled), down));
    }
    Ok((embd, output, output_norm, layers))
}

/// Stacks matrices of one type into a single launch, or keeps them apart when types differ.
/// `role`: theirs (one for the group; `quant::Role`).
fn group(
    w: &mut ImageWriter,
    parts: &[crate::model::TensorRef],
    role: Role,
) -> heapless::Vec<(MatLayout, usize), 3> {
    let mut out = heapless::Vec::new();
    let same = parts
        .iter()
        .all(|t| t.ty == parts[0].ty && t.cols == parts[0].cols);
    if same {
        let _ = out.push((w.matrix(parts, role), 0));
    } else {
        let mut off = 0;
        for t in parts {
            let _ = out.push((w.matrix(std::slice::from_ref(t), role), off));
            off += t.rows;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer's arrays lie in the order the step reads them, after the embedding, output and
    /// output norm, and the last one ends the image: a pull into L2 over a span of it (the
    /// attention launch's, from wo to down) takes what the step reads next.
    #[test]
    fn the_image_keeps_a_layers_arrays_in_the_steps_order() {
        use crate::model::tests::tiny;
        for tied in [true, false] {
            let model = ModelFile::from_bytes(tiny("qwen2", true, tied).build()).unwrap();
            let h = model.hyper().unwrap();
            let mut plan = ImageWriter::plan();
            let (embd, output, output_norm, layers) =
                write_image(&mut plan, &model, &h, None).unwrap();
            let [(norm, qkv, bias, wo, ffn_norm, (gate_up, _), down)] = &layers[..] else {
                panic!("one layer");
            };
            let down = down.as_ref().unwrap();
            let order = [
                embd.q,
                output.q.max(embd.q),
                output_norm,
                *norm,
                qkv[0].0.q,
                bias.unwrap(),
                wo.q,
                *ffn_norm,
                gate_up[0].0.q,
                down.q,
            ];
            assert!(order.windows(2).all(|p| p[0] <= p[1]), "{tied}: {order:?}");
            assert!(output_norm > output.q && *norm > output_norm);
            assert!(plan.len >= down.q + down.bytes && plan.len < down.q + down.bytes + 256);
        }
    }

    #[test]
    fn a_gate_up_of_many_blocks_reads_the_tails_norm_by_default() {
        let auto = CudaOptions::default();
        let tail = |o: &CudaOptions, blocks| {
            let t = norm_tail_for(o, blocks);
            ProductRole::ALL.map(|r| t[r as usize])
        };
        // Qkv, Wo, GateUp, Down, Output.
        assert_eq!(tail(&auto, Some(2240)), [false, false, true, false, false]);
        for blocks in [Some(GATE_UP_NORM_TAIL_BLOCKS), Some(560), Some(192), None] {
            assert_eq!(tail(&auto, blocks), [false; 5], "{blocks:?}");
        }
        // Where the options place the norm themselves the rule stays out; a role asked for
        // (`--ablate norm-tail=ROLE`) is kept either way.
        for in_block_norm in [InBlockNorm::Always, InBlockNorm::Never] {
            let o = CudaOptions {
                in_block_norm,
                ..CudaOptions::default()
            };
            assert_eq!(tail(&o, Some(4096)), [false; 5]);
        }
        let mut asked = CudaOptions::default();
        asked.norm_tail_for[ProductRole::Output as usize] = true;
        assert_eq!(tail(&asked, Some(2240)), [false, false, true, false, true]);
    }
}
