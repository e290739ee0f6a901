//! Speculate-and-refine in the streamed FFN (LeanStream paper 2.1, eq. 1-2): while layer n's
//! down projection runs, layer n+1's reads are guessed from the partial residual and queued,
//! and re-ranked as more of layer n is summed. Only with a table reading the residual after the
//! previous FFN (`--input prev-ffn-output`) and one token at a time (decode); a prefill batch
//! runs layer by layer and has no next layer to read ahead for.

use super::*;

impl StreamedFfn<'_> {
    /// Layer `l`'s down projection over the chosen neurons `idx` (ascending) with activations
    /// `h`, every block in and pinned, into one partial per run of `ROWS_PER_TASK`; returns the
    /// runs. With `refine` (the residual entering this FFN) the runs go in stages of descending
    /// |activation| mass, and after each stage but the last layer l + 1's reads are re-ranked
    /// from the residual plus the runs summed so far. Each run writes only its own partial, and
    /// the caller adds them in run order: the output does not depend on the stages.
    pub(super) fn staged_down(
        &mut self,
        l: usize,
        (idx, h): (&[u32], &[f32]),
        down_ty: crate::model::ggml::GgmlType,
        refine: Option<&[f32]>,
        ks: KernelSet,
        pool: &WorkerPool,
    ) -> usize {
        let k = idx.len();
        let runs = k.div_ceil(ROWS_PER_TASK);
        let dim = self.dim;
        // Speculate-and-refine: the runs in stages of descending |activation| mass; after
        // each but the last, the next layer's reads are re-ranked from the partial
        // residual (paper eq. 2). Each run still writes its own partial, summed in run
        // order below: the output does not depend on the stages.
        let stages = refine.map_or(1, |_| self.control.refine.min(runs).max(1));
        let order = &mut self.run_order[..runs];
        for (r, o) in order.iter_mut().enumerate() {
            *o = r as u32;
        }
        if stages > 1 {
            let mass = &mut self.run_mass[..runs];
            for (r, m) in mass.iter_mut().enumerate() {
                *m = h[r * ROWS_PER_TASK..((r + 1) * ROWS_PER_TASK).min(k)]
                    .iter()
                    .map(|v| v.abs())
                    .sum();
            }
            order.sort_unstable_by(|&a, &b| {
                mass[b as usize]
                    .total_cmp(&mass[a as usize])
                    .then(a.cmp(&b))
            });
            self.stage_x.copy_from_slice(refine.expect("refining"));
        }
        for stage in 0..stages {
            let (from, to) = (stage * runs / stages, (stage + 1) * runs / stages);
            {
                let cols =
                    DownColumns::new(&self.image, &self.cache, self.zero_row, self.base[l], l);
                let row = |n: u32| cols.get(n);
                let out = Disjoint::new(&mut self.partials[..runs * dim]);
                let order = &self.run_order[from..to];
                run_capped(pool, order.len(), self.control.workers, &|i| {
                    let t = order[i] as usize;
                    let ids = &idx[t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(k)];
                    // SAFETY: each run appears once in `order`, and run t writes only its
                    // own partial.
                    let o = unsafe { out.slice(t * dim, dim) };
                    axpy_run(
                        ks,
                        down_ty,
                        ids,
                        &row,
                        &h[t * ROWS_PER_TASK..][..ids.len()],
                        o,
                    );
                });
            }
            if stage + 1 < stages {
                for &t in &self.run_order[from..to] {
                    let p = &self.partials[t as usize * dim..][..dim];
                    for (o, v) in self.stage_x.iter_mut().zip(p) {
                        *o += v;
                    }
                }
                let n = self.image.blocks(l + 1);
                self.predictor.priorities_from(
                    l + 1,
                    self.stage_x,
                    &self.image,
                    &mut self.ahead.guess[..n],
                );
                self.submit_ahead(l + 1, false);
            }
        }
        runs
    }

    /// Queues layer `l`'s reads ahead from the guess in `ahead.guess` (`ReadAhead::submit`) and
    /// starts them; `last`: made from the whole input the table reads. Called once this
    /// layer's blocks are all in, so no arrival it takes in is waited for.
    pub(super) fn submit_ahead(&mut self, l: usize, last: bool) {
        self.stats.ahead += self.ahead.submit(
            l,
            last,
            &self.image,
            self.file,
            self.base[l],
            &mut self.lanes,
            &mut self.cache,
        );
        ReadAhead::start(&mut self.lanes, &mut self.cache);
    }
}
