//! Which blocks the streamed FFN reads for a layer and token (`--predict`), as priorities per
//! block (higher is read sooner, 0 is not read):
//! - `oracle`: the blocks of the neurons the sparse FFN chose, larger activations first;
//! - `stale`: the blocks the previous token used (`predict::Stale`);
//! - `hash`: the `read` neurons the stacked learnable hashing table (`predict::hash`, made by
//!   `leanstream train-predictor`) scores highest from the layer's FFN input, a block at its
//!   best neuron's score;
//! - the baselines `dejavu`, `dejavu-stale`, `bnn` and `powerinfer2` (`predict::mlp`) the same
//!   way from their tables.
//!
//! A table trained on the previous layer's FFN input (the stale context, known a layer ahead)
//! gets it from `prev`: each token's input to the layer before, kept per row of a prefill batch
//! (the batch runs layer by layer); layer 0 gets its own input.

use crate::board::PREFILL_BATCH;
use crate::boot::{Carver, Plan};
use crate::model::flash::FlashImage;
use crate::predict::hash::{top_scores, HashPredictorTable, PredictorInput, MAX_OUT_HEADS};
use crate::predict::mlp::{top_read, MlpPredictorTable, MAX_RANK};
use crate::predict::{PredictKind, Predictor, Stale};
use crate::tables::TableError;
use std::path::{Path, PathBuf};

/// A `--predict hash` table that cannot be used with this image.
#[derive(Debug)]
pub enum PredictorBootError {
    Table {
        path: PathBuf,
        error: TableError,
    },
    /// The table reads an input the streaming engine does not hand it.
    Input(PredictorInput),
    /// The `learned` cache policy's table cannot be used.
    Eviction {
        path: PathBuf,
        error: TableError,
    },
    /// `--refine-stages` with a table that does not read the residual after the FFN.
    Refine,
    /// The table is not the predictor `--predict` names.
    Kind {
        path: PathBuf,
        wanted: PredictKind,
        found: &'static str,
    },
}

impl std::fmt::Display for PredictorBootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PredictorBootError::Table { path, error } => {
                write!(f, "--predictor {}: {error}", path.display())
            }
            PredictorBootError::Eviction { path, error } => {
                write!(f, "--eviction {}: {error}", path.display())
            }
            PredictorBootError::Input(i) => write!(
                f,
                "--predictor: the table predicts from {i:?}, and the streaming engine hands the predictor the layer's FFN input, the previous layer's, or the residual after the previous layer's FFN: train it with --input ffn-input, prev-ffn-input or prev-ffn-output"
            ),
            PredictorBootError::Refine => write!(
                f,
                "--refine-stages: speculate-and-refine guesses the next layer from the residual after this layer's FFN, and the --predictor table reads another input: train it with --input prev-ffn-output, or leave --refine-stages out"
            ),
            PredictorBootError::Kind {
                path,
                wanted,
                found,
            } => write!(
                f,
                "--predictor {}: --predict {} runs {} table, and this one holds a {found} predictor",
                path.display(),
                wanted.name(),
                match wanted {
                    PredictKind::PowerInfer2 => "a dejavu",
                    PredictKind::Bnn => "a bnn",
                    PredictKind::DejavuStale => "a dejavu-stale",
                    PredictKind::Dejavu => "a dejavu",
                    _ => "a hash",
                }
            ),
        }
    }
}

/// The predictor the streamed FFN runs, with its per-token buffers (carved at boot).
pub enum BlockPredictor<'a> {
    Oracle,
    /// A recorded decode's blocks, asked for again (`StreamOptions::replay`): the sets are
    /// recorded layer-major per token (step s is layer s % layers of token s / layers), and
    /// layer l's k-th request takes token k's step (from the first again once they run out).
    Replay {
        steps: std::sync::Arc<Vec<Vec<crate::stream::BlockId>>>,
        /// Per layer, the requests so far.
        calls: Vec<usize>,
    },
    Stale(Stale<'a>),
    Hash {
        table: HashPredictorTable,
        scores: &'a mut [u8],
        count: &'a mut [u32],
        read: &'a mut [u32],
        prev: Option<&'a mut [f32]>,
    },
    Mlp {
        table: MlpPredictorTable,
        hidden: &'a mut [f32],
        scores: &'a mut [f32],
        order: &'a mut [u32],
        read: &'a mut [u32],
        prev: Option<&'a mut [f32]>,
    },
}

/// Runs `score` on the input a table reads: the layer's own `x`, or (stale, `prev` given)
/// the previous layer's for the same token `t`, after which `x` takes its place there.
fn with_input(
    prev: &mut Option<&mut [f32]>,
    l: usize,
    t: usize,
    x: &[f32],
    score: impl FnOnce(&[f32]),
) {
    match prev.as_deref_mut() {
        None => score(x),
        Some(p) => {
            let row = &mut p[t * x.len()..][..x.len()];
            if l == 0 {
                score(x);
            } else {
                score(row);
            }
            row.copy_from_slice(x);
        }
    }
}

impl<'a> BlockPredictor<'a> {
    /// What [`new`](Self::new) carves from the scratch arena.
    pub fn plan(
        plan: &mut Plan,
        kind: PredictKind,
        layers: usize,
        blocks: usize,
        (dim, hidden): (usize, usize),
    ) {
        match kind {
            PredictKind::Oracle => {}
            PredictKind::Stale => Stale::plan(plan, layers, blocks),
            PredictKind::Hash => {
                plan.add::<u8>(hidden);
                plan.add::<u32>(MAX_OUT_HEADS + 1);
                plan.add::<u32>(hidden);
                plan.add::<f32>(PREFILL_BATCH * dim);
            }
            PredictKind::Dejavu
            | PredictKind::DejavuStale
            | PredictKind::Bnn
            | PredictKind::PowerInfer2 => {
                plan.add::<f32>(MAX_RANK);
                plan.add::<f32>(hidden);
                plan.add::<u32>(hidden);
                plan.add::<u32>(hidden);
                plan.add::<f32>(PREFILL_BATCH * dim);
            }
        }
    }

    /// The predictor `kind` for `image` (`blocks`: its largest layer's count); the learned
    /// ones load the table at `table`, checked against the image's model and `kind`.
    pub fn new(
        kind: PredictKind,
        table: Option<&Path>,
        image: &FlashImage,
        blocks: usize,
        scratch: &mut Carver<'a>,
    ) -> Result<BlockPredictor<'a>, super::StreamBootError> {
        let layers = image.layers();
        let g = image.geometry(0);
        let (dim, hidden) = (g.dim as usize, g.neurons as usize);
        let id = image.header.tables_identity;
        let path = || table.expect("StreamArgs requires --predictor with a learned predictor");
        let bad = |error| PredictorBootError::Table {
            path: path().to_path_buf(),
            error,
        };
        // Which tables keep a row per token of a batch: those reading the layer before.
        let stale_input = |input| match input {
            PredictorInput::FfnInput => Ok(false),
            PredictorInput::PrevFfnInput | PredictorInput::PrevFfnOutput => Ok(true),
            other => Err(PredictorBootError::Input(other)),
        };
        Ok(match kind {
            PredictKind::Oracle => BlockPredictor::Oracle,
            PredictKind::Stale => BlockPredictor::Stale(Stale::new(scratch, layers, blocks)?),
            PredictKind::Hash => {
                let table =
                    HashPredictorTable::read(path(), id, layers, dim, hidden).map_err(bad)?;
                let stale = stale_input(table.input)?;
                BlockPredictor::Hash {
                    table,
                    scores: scratch.take(hidden)?,
                    count: scratch.take(MAX_OUT_HEADS + 1)?,
                    read: scratch.take(hidden)?,
                    prev: prev_rows(scratch, dim, stale)?,
                }
            }
            PredictKind::Dejavu
            | PredictKind::DejavuStale
            | PredictKind::Bnn
            | PredictKind::PowerInfer2 => {
                let table =
                    MlpPredictorTable::read(path(), id, layers, dim, hidden).map_err(bad)?;
                let fits = match kind {
                    PredictKind::Bnn => table.binary,
                    PredictKind::DejavuStale => table.name() == "dejavu-stale",
                    _ => table.name() == "dejavu",
                };
                if !fits {
                    return Err(PredictorBootError::Kind {
                        path: path().to_path_buf(),
                        wanted: kind,
                        found: table.name(),
                    }
                    .into());
                }
                let stale = stale_input(table.input)?;
                BlockPredictor::Mlp {
                    table,
                    hidden: scratch.take(MAX_RANK)?,
                    scores: scratch.take(hidden)?,
                    order: scratch.take(hidden)?,
                    read: scratch.take(hidden)?,
                    prev: prev_rows(scratch, dim, stale)?,
                }
            }
        })
    }

    /// Whether it is a table made offline (it picks blocks from the input alone; the runs
    /// then compute the read neurons' activations).
    pub fn is_learned(&self) -> bool {
        matches!(
            self,
            BlockPredictor::Hash { .. }
                | BlockPredictor::Mlp { .. }
                | BlockPredictor::Replay { .. }
        )
    }

    /// Whether the sequence's first position reads every block (the attention sink, which a
    /// table cannot learn: engine/stream_ffn.rs); a replay asks for what was recorded there.
    pub fn reads_all_at_first(&self) -> bool {
        matches!(
            self,
            BlockPredictor::Hash { .. } | BlockPredictor::Mlp { .. }
        )
    }

    /// A new sequence starts: `stale` forgets the last token.
    pub fn reset(&mut self) {
        if let BlockPredictor::Stale(s) = self {
            s.reset();
        }
    }

    /// Whether the table reads the residual after the previous layer's FFN
    /// (`--input prev-ffn-output`): the input speculate-and-refine predicts the next layer from
    /// while this one runs.
    pub fn reads_ffn_output(&self) -> bool {
        match self {
            BlockPredictor::Hash { table, .. } => table.input == PredictorInput::PrevFfnOutput,
            BlockPredictor::Mlp { table, .. } => table.input == PredictorInput::PrevFfnOutput,
            _ => false,
        }
    }

    /// Layer `l`'s priorities into `prio` (one per block) for the FFN input `x` of token `t`
    /// of a batch, `residual` the residual entering the FFN; `chosen` are the neurons the sparse
    /// FFN chose and their activations, `used` their blocks.
    #[allow(clippy::too_many_arguments)]
    pub fn priorities(
        &mut self,
        l: usize,
        t: usize,
        x: &[f32],
        residual: &[f32],
        chosen: (&[u32], &[f32]),
        used: &[u32],
        image: &FlashImage,
        prio: &mut [f32],
    ) {
        match self {
            BlockPredictor::Replay { steps, calls } => {
                prio.fill(0.0);
                let layers = image.layers();
                let tokens = (steps.len() / layers).max(1);
                let s = (calls[l] % tokens) * layers + l;
                calls[l] += 1;
                let base: usize = (0..l).map(|k| image.blocks(k)).sum();
                let set = steps.get(s).map_or(&[][..], |v| &v[..]);
                for (i, &b) in set.iter().enumerate() {
                    // Recorded highest priority first (ascending in old files).
                    if let Some(p) = (b as usize).checked_sub(base).and_then(|b| prio.get_mut(b)) {
                        *p = (set.len() - i) as f32;
                    }
                }
            }
            BlockPredictor::Oracle => {
                prio.fill(0.0);
                for (&n, hv) in chosen.0.iter().zip(chosen.1) {
                    // Larger activations first; every needed block above 0.
                    prio[image.block_of(l, n as usize)] += 1.0 + hv.abs();
                }
            }
            BlockPredictor::Stale(stale) => {
                stale.predict(l, x, prio);
                stale.observe(l, used);
            }
            BlockPredictor::Hash {
                table,
                scores,
                count,
                read,
                prev,
            } => {
                let mut rank =
                    |inp: &[f32]| hash_priorities(table, scores, count, read, l, inp, image, prio);
                match table.input {
                    PredictorInput::PrevFfnOutput => rank(stored_output(prev, l, t, residual)),
                    _ => with_input(prev, l, t, x, rank),
                }
            }
            BlockPredictor::Mlp {
                table,
                hidden,
                scores,
                order,
                read,
                prev,
            } => {
                let mut rank = |inp: &[f32]| {
                    mlp_priorities(table, hidden, scores, order, read, l, inp, image, prio)
                };
                match table.input {
                    PredictorInput::PrevFfnOutput => rank(stored_output(prev, l, t, residual)),
                    _ => with_input(prev, l, t, x, rank),
                }
            }
        }
    }

    /// Layer `l`'s priorities from `input`, the (partial) residual after layer `l - 1`'s FFN:
    /// speculate-and-refine's guess while that FFN still runs. Only for a table that
    /// [`reads_ffn_output`](Self::reads_ffn_output).
    pub fn priorities_from(
        &mut self,
        l: usize,
        input: &[f32],
        image: &FlashImage,
        prio: &mut [f32],
    ) {
        debug_assert!(self.reads_ffn_output());
        match self {
            BlockPredictor::Hash {
                table,
                scores,
                count,
                read,
                ..
            } => hash_priorities(table, scores, count, read, l, input, image, prio),
            BlockPredictor::Mlp {
                table,
                hidden,
                scores,
                order,
                read,
                ..
            } => mlp_priorities(table, hidden, scores, order, read, l, input, image, prio),
            _ => prio.fill(0.0),
        }
    }

    /// Layer `l + 1`'s priorities for token `t` from the residual its FFN left, as
    /// [`after_ffn`](Self::after_ffn) stored it (the last refinement: the whole FFN is in).
    pub fn priorities_after(&mut self, l: usize, t: usize, image: &FlashImage, prio: &mut [f32]) {
        self.priorities(l + 1, t, &[], &[], (&[], &[]), &[], image, prio);
    }

    /// Token `t`'s FFN is done: `residual + out` is what the next layer's table reads, for a
    /// table that [`reads_ffn_output`](Self::reads_ffn_output).
    pub fn after_ffn(&mut self, t: usize, residual: &[f32], out: &[f32]) {
        if !self.reads_ffn_output() {
            return;
        }
        if let BlockPredictor::Hash { prev, .. } | BlockPredictor::Mlp { prev, .. } = self {
            let dim = residual.len();
            let row = &mut prev.as_deref_mut().expect("rows for prev-ffn-output")[t * dim..][..dim];
            for ((r, a), b) in row.iter_mut().zip(residual).zip(out) {
                *r = a + b;
            }
        }
    }
}

/// The input a prev-ffn-output table reads for layer `l` and token `t`: the residual after
/// layer `l - 1`'s FFN (stored by `after_ffn`); layer 0 reads the residual entering its own FFN,
/// as the trainer does.
fn stored_output<'b>(
    prev: &'b Option<&mut [f32]>,
    l: usize,
    t: usize,
    residual: &'b [f32],
) -> &'b [f32] {
    let rows = prev.as_deref().expect("rows for prev-ffn-output");
    let dim = rows.len() / PREFILL_BATCH;
    if l == 0 {
        residual
    } else {
        &rows[t * dim..][..dim]
    }
}

/// The hashing table's `read` top-scored neurons, a block at its best neuron's score.
#[allow(clippy::too_many_arguments)]
fn hash_priorities(
    table: &HashPredictorTable,
    scores: &mut [u8],
    count: &mut [u32],
    read: &mut [u32],
    l: usize,
    input: &[f32],
    image: &FlashImage,
    prio: &mut [f32],
) {
    table.scores(l, input, scores);
    let want = table.layers[l].read as usize;
    let heads = table.out_heads as usize;
    let n = top_scores(scores, want, &mut count[..heads + 1], read);
    prio.fill(0.0);
    for &j in &read[..n] {
        let b = image.block_of(l, j as usize);
        prio[b] = prio[b].max(1.0 + scores[j as usize] as f32);
    }
}

/// The MLP table's `read` top-scored neurons; priorities above 0 in score order.
#[allow(clippy::too_many_arguments)]
fn mlp_priorities(
    table: &MlpPredictorTable,
    hidden: &mut [f32],
    scores: &mut [f32],
    order: &mut [u32],
    read: &mut [u32],
    l: usize,
    input: &[f32],
    image: &FlashImage,
    prio: &mut [f32],
) {
    table.scores(l, input, hidden, scores);
    let n = top_read(scores, table.layers[l].read as usize, order, read);
    // The score over the lowest one read.
    let lowest = read[..n]
        .iter()
        .map(|&j| scores[j as usize])
        .fold(f32::INFINITY, f32::min);
    prio.fill(0.0);
    for &j in &read[..n] {
        let b = image.block_of(l, j as usize);
        prio[b] = prio[b].max(1.0 + (scores[j as usize] - lowest));
    }
}

/// The stale context's rows (one per token of a prefill batch), when a table reads it.
fn prev_rows<'a>(
    scratch: &mut Carver<'a>,
    dim: usize,
    stale: bool,
) -> Result<Option<&'a mut [f32]>, crate::boot::BootError> {
    let rows = scratch.take::<f32>(PREFILL_BATCH * dim)?;
    rows.fill(0.0);
    Ok(stale.then_some(rows))
}

#[cfg(test)]
mod tests {
    use super::with_input;

    /// A stale table sees, for each token of a batch, the input of the layer before for that
    /// same token (its own at layer 0); a fresh one sees the layer's.
    #[test]
    fn stale_tables_get_the_previous_layers_input_of_the_same_token() {
        let mut rows = vec![0f32; 2 * 3];
        let mut prev = Some(rows.as_mut_slice());
        let seen = |prev: &mut Option<&mut [f32]>, l, t, x: &[f32]| {
            let mut got = Vec::new();
            with_input(prev, l, t, x, |i| got = i.to_vec());
            got
        };
        // Layer-major, as a prefill batch of two tokens runs.
        assert_eq!(seen(&mut prev, 0, 0, &[1.0, 1.0, 1.0]), [1.0; 3]);
        assert_eq!(seen(&mut prev, 0, 1, &[2.0, 2.0, 2.0]), [2.0; 3]);
        assert_eq!(seen(&mut prev, 1, 0, &[3.0, 3.0, 3.0]), [1.0; 3]);
        assert_eq!(seen(&mut prev, 1, 1, &[4.0, 4.0, 4.0]), [2.0; 3]);
        assert_eq!(seen(&mut prev, 2, 1, &[5.0, 5.0, 5.0]), [4.0; 3]);
        assert_eq!(seen(&mut None, 2, 1, &[5.0, 5.0, 5.0]), [5.0; 3]);
    }
}
