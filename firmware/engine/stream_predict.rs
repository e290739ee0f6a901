//! Which blocks the streamed FFN reads for a layer and token (`--predict`), as priorities per
//! block (higher is read sooner, 0 is not read):
//! - `oracle`: the blocks of the neurons the sparse FFN chose, larger activations first;
//! - `stale`: the blocks the previous token used (`predict::Stale`);
//! - `hash`: the `read` neurons the stacked learnable hashing table (`predict::hash`, made by
//!   `leanstream train-predictor`) scores highest from the layer's FFN input, a block at its
//!   best neuron's score.

use crate::boot::{Carver, Plan};
use crate::model::flash::FlashImage;
use crate::predict::hash::{top_scores, HashPredictorTable, PredictorInput, MAX_OUT_HEADS};
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
}

impl std::fmt::Display for PredictorBootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PredictorBootError::Table { path, error } => {
                write!(f, "--predictor {}: {error}", path.display())
            }
            PredictorBootError::Input(i) => write!(
                f,
                "--predictor: the table predicts from {i:?}, and the streaming engine hands the predictor the layer's FFN input: train it with --input ffn-input"
            ),
        }
    }
}

/// The predictor the streamed FFN runs, with its per-token buffers (carved at boot).
pub enum BlockPredictor<'a> {
    Oracle,
    Stale(Stale<'a>),
    Hash {
        table: HashPredictorTable,
        scores: &'a mut [u8],
        count: &'a mut [u32],
        read: &'a mut [u32],
    },
}

impl<'a> BlockPredictor<'a> {
    /// What [`new`](Self::new) carves from the scratch arena.
    pub fn plan(plan: &mut Plan, kind: PredictKind, layers: usize, blocks: usize, hidden: usize) {
        match kind {
            PredictKind::Oracle => {}
            PredictKind::Stale => Stale::plan(plan, layers, blocks),
            PredictKind::Hash => {
                plan.add::<u8>(hidden);
                plan.add::<u32>(MAX_OUT_HEADS + 1);
                plan.add::<u32>(hidden);
            }
        }
    }

    /// The predictor `kind` for `image` (`blocks`: its largest layer's count); `hash` loads
    /// the table at `table`, checked against the image's model.
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
        Ok(match kind {
            PredictKind::Oracle => BlockPredictor::Oracle,
            PredictKind::Stale => BlockPredictor::Stale(Stale::new(scratch, layers, blocks)?),
            PredictKind::Hash => {
                let path = table.expect("StreamArgs requires --predictor with --predict hash");
                let id = image.header.tables_identity;
                let table =
                    HashPredictorTable::read(path, id, layers, dim, hidden).map_err(|error| {
                        PredictorBootError::Table {
                            path: path.to_path_buf(),
                            error,
                        }
                    })?;
                if table.input != PredictorInput::FfnInput {
                    return Err(PredictorBootError::Input(table.input).into());
                }
                BlockPredictor::Hash {
                    table,
                    scores: scratch.take(hidden)?,
                    count: scratch.take(MAX_OUT_HEADS + 1)?,
                    read: scratch.take(hidden)?,
                }
            }
        })
    }

    /// A new sequence starts: `stale` forgets the last token.
    pub fn reset(&mut self) {
        if let BlockPredictor::Stale(s) = self {
            s.reset();
        }
    }

    /// Layer `l`'s priorities into `prio` (one per block) for the FFN input `x`; `chosen` are
    /// the neurons the sparse FFN chose and their activations, `used` their blocks.
    pub fn priorities(
        &mut self,
        l: usize,
        x: &[f32],
        chosen: (&[u32], &[f32]),
        used: &[u32],
        image: &FlashImage,
        prio: &mut [f32],
    ) {
        match self {
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
            } => {
                table.scores(l, x, scores);
                let want = table.layers[l].read as usize;
                let n = top_scores(
                    scores,
                    want,
                    &mut count[..table.out_heads as usize + 1],
                    read,
                );
                prio.fill(0.0);
                for &j in &read[..n] {
                    let b = image.block_of(l, j as usize);
                    prio[b] = prio[b].max(1.0 + scores[j as usize] as f32);
                }
            }
        }
    }
}
