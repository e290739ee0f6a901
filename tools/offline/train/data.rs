//! What the predictors read from a trace: each layer's input row as a [`PredictorInput`] says,
//! and the oracle's labels.

use crate::offline::oracle;
use crate::offline::trace::TraceReader;
use leanstream::predict::hash::PredictorInput;

/// A trace's input tensors, and which one a predictor reads.
pub struct Inputs<'a> {
    residual: &'a [f32],
    ffn_input: &'a [f32],
    /// The partial residuals after each stage ([T, L, K, dim]); the last stage's is x_n plus
    /// the whole FFN's output.
    stage_last: &'a [f32],
    stages: usize,
    layers: usize,
    pub dim: usize,
}

impl<'a> Inputs<'a> {
    pub fn new(trace: &'a TraceReader) -> Result<Inputs<'a>, String> {
        Ok(Inputs {
            residual: trace.tensor("ffn_residual")?,
            ffn_input: trace.tensor("ffn_input")?,
            stage_last: trace.tensor("stage_residual_priority")?,
            stages: trace.stages,
            layers: trace.layers,
            dim: trace.dim,
        })
    }

    /// Token `t`'s input to layer `l`'s predictor.
    pub fn row(&self, input: PredictorInput, t: usize, l: usize) -> &'a [f32] {
        let at = |v: &'a [f32], l: usize| &v[(t * self.layers + l) * self.dim..][..self.dim];
        match input {
            PredictorInput::FfnInput => at(self.ffn_input, l),
            PredictorInput::Residual => at(self.residual, l),
            PredictorInput::PrevResidual => at(self.residual, l.saturating_sub(1)),
            PredictorInput::PrevFfnInput => at(self.ffn_input, l.saturating_sub(1)),
            PredictorInput::PrevFfnOutput if l == 0 => at(self.residual, 0),
            // The last stage's partial residual is the whole FFN's output added.
            PredictorInput::PrevFfnOutput => {
                let k = self.stages;
                &self.stage_last[((t * self.layers + l - 1) * k + k - 1) * self.dim..][..self.dim]
            }
        }
    }
}

pub fn parse_input(s: &str) -> Result<PredictorInput, String> {
    match s {
        "ffn-input" => Ok(PredictorInput::FfnInput),
        "residual" => Ok(PredictorInput::Residual),
        "prev-residual" => Ok(PredictorInput::PrevResidual),
        "prev-ffn-input" => Ok(PredictorInput::PrevFfnInput),
        "prev-ffn-output" => Ok(PredictorInput::PrevFfnOutput),
        _ => Err(format!(
            "unknown --input '{s}': expected ffn-input, residual, prev-residual, prev-ffn-input or prev-ffn-output"
        )),
    }
}

/// One layer's training set: inputs [N, dim] and 0/1 labels [N, neurons] (1: in the oracle
/// set at the layer's threshold `thr`).
pub fn layer_set(
    trace: &TraceReader,
    inputs: &Inputs,
    input: PredictorInput,
    l: usize,
    thr: f32,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    let acts = trace.tensor("neuron_act")?;
    let (n, nl) = (trace.hidden, trace.layers);
    let mut x = Vec::with_capacity(trace.tokens * inputs.dim);
    let mut y = vec![0f32; trace.tokens * n];
    let mut set = Vec::new();
    for t in 0..trace.tokens {
        // As the tables read it (divided by its RMS for the residual inputs).
        let row = inputs.row(input, t, l);
        let scale = input.scale(row);
        x.extend(row.iter().map(|v| v * scale));
        oracle::oracle_set(&acts[(t * nl + l) * n..][..n], thr, &mut set);
        for &j in &set {
            y[t * n + j as usize] = 1.0;
        }
    }
    Ok((x, y))
}
