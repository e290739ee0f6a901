//! The prompt's batched path: `Engine::prefill` and `Engine::score` run tokens through the
//! model in batches of the board's `PREFILL_BATCH` (`forward_batch`), each matrix read once a
//! batch, with the cache and logits bit-identical to `forward` a token at a time.

use super::*;

impl Engine<'_> {
    /// Runs the prompt `tokens` (at least one) at positions `pos..` and returns the logits after
    /// its last token. The tokens go through the model in batches of up to the board's
    /// `PREFILL_BATCH`: each matrix streams from memory once per batch instead of once per
    /// token. The cache and the logits are bit-identical to running the tokens one by one
    /// (`forward`), which an activation trace (recorded per token) still does.
    pub fn prefill(&mut self, tokens: &[u32], pos: usize) -> &mut [f32] {
        assert!(!tokens.is_empty(), "an empty prompt");
        let last = tokens.len() - 1;
        if self.tap.is_some() {
            for (i, &t) in tokens[..last].iter().enumerate() {
                self.forward(t, pos + i);
            }
            return self.forward(tokens[last], pos + last);
        }
        for (i, chunk) in tokens.chunks(PREFILL_BATCH).enumerate() {
            self.forward_batch(chunk, pos + i * PREFILL_BATCH);
        }
        // The logits of the last token, from its row of the last batch: forward's last steps.
        let dim = self.hyper.dim;
        let x = &self.b.x[(last % PREFILL_BATCH) * dim..][..dim];
        rmsnorm(self.s.xb, x, self.output_norm, self.hyper.norm_eps);
        matvec(
            self.kernels,
            &self.pool,
            &self.output,
            self.s.xb,
            &mut self.act,
            self.s.logits,
        );
        self.s.logits
    }

    /// Runs `tokens` at positions `pos..` in batches, as `prefill`, and hands every token's
    /// logits to `each` (its index in `tokens`, the logits), in order; the output head runs
    /// once per batch for all its tokens. Bit-identical to `forward` token by token.
    pub fn score(&mut self, tokens: &[u32], pos: usize, each: &mut dyn FnMut(usize, &mut [f32])) {
        if self.tap.is_some() {
            for (i, &t) in tokens.iter().enumerate() {
                each(i, self.forward(t, pos + i));
            }
            return;
        }
        let (dim, vocab) = (self.hyper.dim, self.hyper.vocab_size);
        for (c, chunk) in tokens.chunks(PREFILL_BATCH).enumerate() {
            self.forward_batch(chunk, pos + c * PREFILL_BATCH);
            // forward's last steps for every row: the final norm, then the output head.
            let n = chunk.len();
            let b = &mut self.b;
            for (xbt, xt) in b.xb[..n * dim]
                .chunks_exact_mut(dim)
                .zip(b.x[..n * dim].chunks_exact(dim))
            {
                rmsnorm(xbt, xt, self.output_norm, self.hyper.norm_eps);
            }
            let logits = &mut b.logits[..n * vocab];
            matmul_many(
                self.kernels,
                &self.pool,
                &mut [(&self.output, &mut *logits)],
                &b.xb[..n * dim],
                &mut b.acts[..n],
            );
            for (t, l) in logits.chunks_exact_mut(vocab).enumerate() {
                each(c * PREFILL_BATCH + t, l);
            }
        }
    }

    /// `forward` for up to `PREFILL_BATCH` consecutive tokens from `pos`, without the logits
    /// (the residual of token `t` is left in row `t` of `b.x`):
    /// the same steps in the same order for each token, with the products of all tokens done
    /// together (`matmul_many`) and every head of every token attending at once.
    fn forward_batch(&mut self, tokens: &[u32], pos: usize) {
        let h = &self.hyper;
        let n = tokens.len();
        assert!(n <= PREFILL_BATCH, "{n} tokens in one batch");
        assert!(
            pos + n <= self.context,
            "positions {pos}..{} past the context of {}",
            pos + n,
            self.context
        );
        let (dim, head_dim, n_heads, hidden) = (h.dim, h.head_dim, h.n_heads, h.hidden_dim);
        let kv_dim = h.n_kv_heads * head_dim;
        let q_dim = n_heads * head_dim;
        let group = n_heads / h.n_kv_heads;
        let sub = self.heads_per_attention_task(n * h.n_kv_heads);
        let half = head_dim / 2;
        let ctx = self.context;
        let b = &mut self.b;
        let (pool, ks) = (&self.pool, self.kernels);
        let acts = &mut b.acts[..n];
        let (x, xb, xo) = (
            &mut b.x[..n * dim],
            &mut b.xb[..n * dim],
            &mut b.xo[..n * q_dim],
        );
        let (q, k, v) = (
            &mut b.q[..n * q_dim],
            &mut b.k[..n * kv_dim],
            &mut b.v[..n * kv_dim],
        );
        let (hb, hb2) = (&mut b.hb[..n * hidden], &mut b.hb2[..n * hidden]);

        // Embeddings, the cache's room for every position, and each position's rotary angles.
        for (t, (&token, xt)) in tokens.iter().zip(x.chunks_exact_mut(dim)).enumerate() {
            assert!(
                (token as usize) < h.vocab_size,
                "token {token} past the vocabulary of {}",
                h.vocab_size
            );
            self.token_embd.row_f32(token as usize, xt);
            self.kv.begin_token(pos + t);
            rope_angles(
                &mut b.rope_cos[t * half..][..half],
                &mut b.rope_sin[t * half..][..half],
                head_dim,
                pos + t,
                h.rope_base,
            );
        }
        for (l, w) in self.layers.iter().enumerate() {
            // Attention: q, k and v of every token; each token's k and v go into the cache.
            for_each_row(pool, xb, dim, &|t, xbt| {
                rmsnorm(xbt, &x[t * dim..][..dim], w.attn_norm, h.norm_eps)
            });
            matmul_many(
                ks,
                pool,
                &mut [(&w.wq, &mut *q), (&w.wk, &mut *k), (&w.wv, &mut *v)],
                xb,
                acts,
            );
            for t in 0..n {
                let qt = &mut q[t * q_dim..][..q_dim];
                let kt = &mut k[t * kv_dim..][..kv_dim];
                let vt = &mut v[t * kv_dim..][..kv_dim];
                if let Some(bias) = w.qkv_bias {
                    add(qt, &bias[..q_dim]);
                    add(kt, &bias[q_dim..q_dim + kv_dim]);
                    add(vt, &bias[q_dim + kv_dim..]);
                }
                let (cos, sin) = (
                    &b.rope_cos[t * half..][..half],
                    &b.rope_sin[t * half..][..half],
                );
                rope(qt, cos, sin, h.rope_style);
                rope(kt, cos, sin, h.rope_style);
                let (kr, vr) = self.kv.rows();
                kr.copy_from_slice(kt);
                vr.copy_from_slice(vt);
                self.kv.commit(l, pos + t);
            }

            // Every head of every token attends over positions 0..=its own, `sub` heads of one
            // KV head a task.
            let kv = &self.kv;
            let out = Disjoint::new(xo);
            let att = Disjoint::new(&mut b.att[..n * n_heads * ctx]);
            let q = &*q;
            let tasks_per_token = n_heads / sub;
            pool.run(n * tasks_per_token, &|task| {
                let t = task / tasks_per_token;
                let head = task % tasks_per_token * sub;
                let first = t * n_heads + head;
                // SAFETY: task (t, head) touches only its own heads' slices of `out` and `att`.
                let (o, a) = unsafe {
                    (
                        out.slice(first * head_dim, sub * head_dim),
                        att.slice(first * ctx, (sub - 1) * ctx + pos + t + 1),
                    )
                };
                kv.attend_heads(
                    l,
                    head / group,
                    &q[t * q_dim + head * head_dim..][..sub * head_dim],
                    pos + t,
                    a,
                    ctx,
                    o,
                );
            });
            matmul_many(ks, pool, &mut [(&w.wo, &mut *xb)], xo, acts);
            add(x, xb);

            // Feed-forward: SwiGLU over every neuron, or over the ones each token needs.
            for_each_row(pool, xb, dim, &|t, xbt| {
                rmsnorm(xbt, &x[t * dim..][..dim], w.ffn_norm, h.norm_eps)
            });
            match &w.ffn {
                LayerFfn::Dense { gate, up, down } => {
                    matmul_many(ks, pool, &mut [(gate, &mut *hb), (up, &mut *hb2)], xb, acts);
                    let up_out = &*hb2;
                    for_each_row(pool, hb, hidden, &|t, gt| {
                        for (g, u) in gt.iter_mut().zip(&up_out[t * hidden..][..hidden]) {
                            *g = silu(*g) * u;
                        }
                    });
                    matmul_many(ks, pool, &mut [(down, &mut *xb)], hb, acts);
                }
                LayerFfn::Bundles(bundles) => {
                    let sparse = self.sparse.as_mut().expect("bundles come with SparseFfn");
                    for xbt in xb.chunks_exact_mut(dim) {
                        sparse.forward(l, bundles, ks, pool, xbt, &mut acts[0]);
                    }
                }
                LayerFfn::Streamed => {
                    let sparse = self
                        .sparse
                        .as_mut()
                        .expect("streaming comes with SparseFfn");
                    let stream = self.stream.as_mut().expect("a streamed layer");
                    for (t, xbt) in xb.chunks_exact_mut(dim).enumerate() {
                        let residual = &x[t * dim..][..dim];
                        stream.forward_layer(
                            l,
                            t,
                            pos + t == 0,
                            residual,
                            false,
                            sparse,
                            ks,
                            pool,
                            xbt,
                            &mut acts[0],
                        );
                    }
                }
            }
            add(x, xb);
        }
        if let Some(st) = self.stream.as_mut() {
            st.end_tokens(n);
        }
    }
}
