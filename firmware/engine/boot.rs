//! `Engine::boot`: the model placed in the board's arenas after its plan is checked (the
//! weights, the KV cache, the activations and the workers), so nothing is decoded before every
//! budget has been checked.

use super::*;

impl<'a> Engine<'a> {
    /// Checks that the model fits the board ([`plan`](Self::plan)), then places it in the
    /// arenas. Nothing is decoded before every budget has been checked.
    pub fn boot(
        arenas: &'a mut Arenas,
        model: &ModelFile,
        opts: EngineOptions,
    ) -> Result<Engine<'a>, EngineError> {
        let boot_plan = Self::plan(model, &opts)?;
        boot_plan.check(arenas)?;
        let (shape, kv_precision) = (boot_plan.shape, boot_plan.kv_precision);
        let context = shape.context;
        let h = model.hyper()?;
        let kv_dim = h.n_kv_heads * h.head_dim;
        let q_dim = h.n_heads * h.head_dim;
        let mut placer = Placer::new(&opts);
        let emb = Role::EmbedOrOutput;
        // Each layer matrix's role, by its full name (the first and last layer keep more bits).
        let role = |i: usize, n: &str| Role::of(&format!("blk.{i}.{n}"), h.n_layers);
        let sparse = opts.ffn.mode != FfnMode::Dense;
        let layer_name = |i: usize, n: &str| format!("blk.{i}.{n}");
        let scale_keys = kv_precision == KvPrecision::I8 && h.qkv_bias;

        // Place the weights.
        let mut d = arenas.dense.carver();
        let mut f = arenas.ffn.carver();
        let token_embd = placer.place(&mut d, &model.tensor("token_embd.weight")?, emb)?;
        let output_norm = place_vector(&mut d, &model.tensor("output_norm.weight")?)?;
        let output = if h.tied_output {
            token_embd
        } else {
            placer.place(&mut d, &model.tensor("output.weight")?, emb)?
        };
        let mut layers = Vec::with_capacity(h.n_layers);
        for i in 0..h.n_layers {
            let t = |n: &str| model.tensor(&layer_name(i, n));
            // Layer matrix `n`, in its role's type.
            let matrix = |p: &mut Placer, c: &mut Carver<'a>, n: &str| -> Result<_, EngineError> {
                Ok(p.place(c, &t(n)?, role(i, n))?)
            };
            let qkv_bias = if h.qkv_bias {
                let b = d.take::<f32>(q_dim + 2 * kv_dim)?;
                let (bq, rest) = b.split_at_mut(q_dim);
                let (bk, bv) = rest.split_at_mut(kv_dim);
                let (tq, tk, tv) = (t("attn_q.bias")?, t("attn_k.bias")?, t("attn_v.bias")?);
                dequantize_row(tq.ty, tq.data, bq);
                dequantize_row(tk.ty, tk.data, bk);
                dequantize_row(tv.ty, tv.data, bv);
                Some(&*b)
            } else {
                None
            };
            let ffn = if opts.stream.is_some() {
                LayerFfn::Streamed
            } else if sparse {
                let (g, u, dn) = (
                    t("ffn_gate.weight")?,
                    t("ffn_up.weight")?,
                    t("ffn_down.weight")?,
                );
                LayerFfn::Bundles(Bundles::build(&mut f, &g, &u, &dn, opts.ffn.bundle_down)?)
            } else {
                LayerFfn::Dense {
                    gate: matrix(&mut placer, &mut f, "ffn_gate.weight")?,
                    up: matrix(&mut placer, &mut f, "ffn_up.weight")?,
                    down: matrix(&mut placer, &mut f, "ffn_down.weight")?,
                }
            };
            layers.push(Layer {
                attn_norm: place_vector(&mut d, &t("attn_norm.weight")?)?,
                wq: matrix(&mut placer, &mut d, "attn_q.weight")?,
                wk: matrix(&mut placer, &mut d, "attn_k.weight")?,
                wv: matrix(&mut placer, &mut d, "attn_v.weight")?,
                wo: matrix(&mut placer, &mut d, "attn_output.weight")?,
                qkv_bias,
                ffn_norm: place_vector(&mut d, &t("ffn_norm.weight")?)?,
                ffn,
            });
        }
        for m in [&token_embd, &output] {
            if m.ty.row_bytes(m.cols).is_none() {
                return Err(EngineError::Unsupported(format!(
                    "{} rows of {} values",
                    m.ty.name(),
                    m.cols
                )));
            }
        }

        let mut k = arenas.kv.carver();
        let mut c = arenas.scratch.carver();
        // Touch every page of the cache and activations now: the memory the engine will ever
        // use is resident from boot, so it does not grow while serving.
        let rows = h.n_layers * context * kv_dim;
        let (kbuf, vbuf) = (c.take(kv_dim)?, c.take(kv_dim)?);
        let store = match kv_precision {
            KvPrecision::I8 => {
                let (kq, vq) = (
                    k.take::<i8>(shape.i8_values())?,
                    k.take::<i8>(shape.i8_values())?,
                );
                let (ks, vs) = (
                    k.take::<f32>(shape.i8_scales())?,
                    k.take::<f32>(shape.i8_scales())?,
                );
                kq.fill(0);
                vq.fill(0);
                ks.fill(0.0);
                vs.fill(0.0);
                Storage::I8 {
                    k: kq,
                    v: vq,
                    ks,
                    vs,
                    kbuf,
                    vbuf,
                }
            }
            KvPrecision::F16 => {
                let (kh, vh) = (k.take::<u16>(rows)?, k.take::<u16>(rows)?);
                kh.fill(0);
                vh.fill(0);
                Storage::F16 {
                    k: kh,
                    v: vh,
                    kbuf,
                    vbuf,
                }
            }
            KvPrecision::F32 => {
                let (kf, vf) = (k.take::<f32>(rows)?, k.take::<f32>(rows)?);
                kf.fill(0.0);
                vf.fill(0.0);
                Storage::F32 {
                    k: kf,
                    v: vf,
                    kbuf,
                    vbuf,
                }
            }
        };
        let s = Scratch {
            x: c.take(h.dim)?,
            xb: c.take(h.dim)?,
            xb2: c.take(h.dim.max(q_dim))?,
            q: c.take(q_dim)?,
            hb: c.take(h.hidden_dim)?,
            hb2: c.take(h.hidden_dim)?,
            att: c.take(h.n_heads * context)?,
            logits: c.take(h.vocab_size)?,
            rope_cos: c.take(h.head_dim / 2)?,
            rope_sin: c.take(h.head_dim / 2)?,
        };
        let max_cols = h.dim.max(h.hidden_dim).max(q_dim);
        let [bx, bxb, bxo, bq, bk, bv, bhb, bhb2, batt, bcos, bsin, blogits] =
            Batch::sizes(&h, context);
        let b = Batch {
            x: c.take(bx)?,
            xb: c.take(bxb)?,
            xo: c.take(bxo)?,
            q: c.take(bq)?,
            k: c.take(bk)?,
            v: c.take(bv)?,
            hb: c.take(bhb)?,
            hb2: c.take(bhb2)?,
            att: c.take(batt)?,
            rope_cos: c.take(bcos)?,
            rope_sin: c.take(bsin)?,
            logits: c.take(blogits)?,
            acts: (0..PREFILL_BATCH)
                .map(|_| ActScratch::new(max_cols))
                .collect(),
        };
        for buf in [
            &mut *b.x,
            &mut *b.xb,
            &mut *b.xo,
            &mut *b.q,
            &mut *b.k,
            &mut *b.v,
            &mut *b.hb,
            &mut *b.hb2,
            &mut *b.att,
            &mut *b.rope_cos,
            &mut *b.rope_sin,
            &mut *b.logits,
        ] {
            buf.fill(0.0);
        }
        let sample_idx = Some(c.take::<u32>(h.vocab_size)?);
        let sparse = if sparse {
            Some(SparseFfn::new(
                &mut c,
                h.n_layers,
                h.hidden_dim,
                h.dim,
                &opts.ffn,
            )?)
        } else {
            None
        };
        let tap = match &opts.tap {
            Some(t) => Some(Tap::new(&mut c, h.n_layers, h.dim, h.hidden_dim, t)?),
            None => None,
        };
        let stream = match &opts.stream {
            Some(so) => {
                // A learned predictor's runs keep the read neurons at the calibrated threshold
                // of |SiLU(gate) * up|: no other choice is known before every neuron is seen.
                if so.predict.needs_table()
                    && (opts.ffn.mode != FfnMode::Oracle || opts.ffn.score != Score::Glu)
                {
                    return Err(EngineError::Options(format!(
                        "--predict {} keeps the neurons it read at the calibrated thresholds: use --ffn oracle with the glu score",
                        so.predict.name()
                    )));
                }
                let image = StreamedFfn::open_image(so, &h).map_err(EngineError::Flash)?;
                let (n_flags, n_staging) = (arenas.flags.len() / 4, arenas.io_staging.len());
                let flags = arenas.flags.carver().take::<u32>(n_flags)?;
                let staging = arenas.io_staging.carver().take::<u8>(n_staging)?;
                let ffn_len = f.left();
                let ffn = f.take::<u8>(ffn_len)?;
                Some(
                    StreamedFfn::new(image, so, ffn, flags, staging, &mut c)
                        .map_err(EngineError::Stream)?,
                )
            }
            None => None,
        };
        s.att.fill(0.0);
        let mut kv = KvCache::new(shape, store, opts.kv_policy);
        kv.set_avx2(opts.kernels.kernel == crate::backend::cpu::Kernel::Avx2);
        if scale_keys {
            let scales = c.take::<f32>(h.n_layers * kv_dim)?;
            let half = h.head_dim / 2;
            for (layer, out) in layers.iter().zip(scales.chunks_exact_mut(kv_dim)) {
                let bias = &layer.qkv_bias.expect("qkv_bias")[q_dim..q_dim + kv_dim];
                crate::kv::key_scales_from_bias(
                    bias,
                    h.head_dim,
                    |i| h.rope_style.pair(i, half),
                    out,
                );
            }
            kv.scale_keys(scales);
        }
        Ok(Engine {
            hyper: h,
            context,
            token_embd,
            layers,
            output_norm,
            output,
            kv,
            s,
            b,
            sample_idx,
            pool: WorkerPool::new(opts.threads.max(1)),
            kernels: opts.kernels,
            act: ActScratch::new(max_cols),
            precision: opts.precision,
            conversions: placer.report,
            sparse,
            tap,
            stream,
        })
    }
}
