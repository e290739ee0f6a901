//! `leanstream calibrate`: per-layer FFN activation thresholds for target sparsities
//! (`leanstream_tools::offline::calibrate`).

use super::text_args::{text_tokens, TextArgs};
use super::*;

#[derive(Args)]
pub struct CalibrateArgs {
    /// GGUF file or llama2.c checkpoint.
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file for a llama2.c checkpoint (tok*.bin; default: one beside the model).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    text: TextArgs,
    /// Target sparsities, comma-separated, each in [0, 1).
    #[arg(long)]
    sparsity: String,
    /// Output (default: tables/<model file stem>.thresh).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn cmd_calibrate(a: CalibrateArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    let sparsities: Vec<f32> = a
        .sparsity
        .split(',')
        .map(leanstream::sparsity::parse_sparsity)
        .collect::<Result<_, _>>()?;
    let tokens = text_tokens(&tok, &a.text)?;
    let out = a.out.clone().unwrap_or_else(|| default_path(&a.model));
    let mut o = plain_options(a.threads);
    o.tap = Some(TapOptions::default());
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot_plain(&mut arenas, &file, &a.model, o)?;
    let (n_layers, hidden) = (engine.hyper.n_layers, engine.hyper.hidden_dim);
    if a.text.ctx > engine.context {
        return Err(format!(
            "--ctx {} is larger than the engine's context {}",
            a.text.ctx, engine.context
        ));
    }
    let started = Instant::now();
    let ctx = a.text.ctx;
    // Two passes: thresholds, then the dropped-neuron means under them.
    let (hist, levels) = leanstream_tools::offline::calibrate::calibrate(
        &mut engine,
        &tokens,
        ctx,
        &sparsities,
        &mut |done| {
            if done % ctx == 0 {
                eprintln!(
                    "calibrate: {done} / {} tokens over two passes ({:.1} tok/s)",
                    2 * tokens.len(),
                    done as f64 / started.elapsed().as_secs_f64()
                );
            }
        },
    )?;
    let table = ThresholdTable {
        n_layers: n_layers as u32,
        hidden: hidden as u32,
        calibration: format!(
            "{}: {} tokens after skipping {}, windows of {}",
            a.text.file.display(),
            tokens.len(),
            a.text.skip_tokens,
            a.text.ctx
        ),
        tokens: tokens.len() as u64,
        levels,
    };
    for lv in &table.levels {
        let mean = |score, t: &[f32]| {
            (0..n_layers)
                .map(|l| hist.fraction_below(l, score, t[l]))
                .sum::<f64>()
                / n_layers as f64
        };
        println!(
            "sparsity {:.2}: glu thresholds {:.3e}..{:.3e} (calibration drops {:.4}), gate thresholds {:.3e}..{:.3e} (drops {:.4})",
            lv.sparsity,
            lv.glu.iter().copied().fold(f32::MAX, f32::min),
            lv.glu.iter().copied().fold(0.0, f32::max),
            mean(Score::Glu, &lv.glu),
            lv.gate.iter().copied().fold(f32::MAX, f32::min),
            lv.gate.iter().copied().fold(0.0, f32::max),
            mean(Score::Gate, &lv.gate),
        );
    }
    table.save(&out, &file)?;
    println!(
        "wrote {} ({} levels, {} tokens)",
        out.display(),
        table.levels.len(),
        tokens.len()
    );
    Ok(())
}
