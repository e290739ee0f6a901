//! `leanstream trace`: per token and layer, the FFN's residual, input, staged partial residuals
//! and neuron activations (`leanstream_tools::offline::trace`).

use super::text_args::{text_tokens, TextArgs};
use super::*;

#[derive(Args)]
pub struct TraceArgs {
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
    /// Stages K of the partial residuals.
    #[arg(long, default_value_t = 8)]
    stages: usize,
    /// The stages split the neurons the oracle keeps at this sparsity (0: every neuron).
    #[arg(long, default_value_t = 0.8)]
    sparsity: f32,
    /// Thresholds table (default: tables/<model file stem>.thresh in the working directory,
    /// beside the model, or in the repository).
    #[arg(long)]
    thresholds: Option<PathBuf>,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

pub fn cmd_trace(a: TraceArgs) -> Result<(), String> {
    use leanstream_tools::offline::trace::{TraceMeta, TraceWriter};
    let (file, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    leanstream::sparsity::check_sparsity(a.sparsity)?;
    if a.stages == 0 {
        return Err("--stages must be at least 1".into());
    }
    let tokens = text_tokens(&tok, &a.text)?;
    let thresholds = if a.sparsity > 0.0 {
        let path = match a.thresholds.clone() {
            Some(p) => p,
            None => find_default(&a.model)?,
        };
        Some(ThresholdTable::load(&path, &file)?.thresholds(a.sparsity, Score::Glu)?)
    } else {
        None
    };
    let mut o = plain_options(a.threads);
    o.tap = Some(TapOptions {
        stages: a.stages,
        thresholds,
    });
    let meta = TraceMeta {
        model: a
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        identity: leanstream::tables::model_identity(&file),
        text: a.text.file.display().to_string(),
        skip_tokens: a.text.skip_tokens,
        ctx: a.text.ctx,
        sparsity: a.sparsity,
    };
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot_plain(&mut arenas, &file, &a.model, o)?;
    if a.text.ctx > engine.context {
        return Err(format!(
            "--ctx {} is larger than the engine's context {}",
            a.text.ctx, engine.context
        ));
    }
    let (mut w, per_token) =
        TraceWriter::create(&a.out, engine.tap().expect("tap"), tokens.len(), &meta)?;
    println!(
        "trace: {} tokens, {} bytes per token ({:.2} MiB), {:.1} MiB in all -> {}",
        tokens.len(),
        per_token,
        per_token as f64 / 1048576.0,
        (per_token * tokens.len() as u64) as f64 / 1048576.0,
        a.out.display()
    );
    let started = Instant::now();
    for (i, &t) in tokens.iter().enumerate() {
        let pos = i % a.text.ctx;
        engine.forward(t, pos);
        w.write(i, t, pos, engine.tap().expect("tap"))?;
        if (i + 1) % 64 == 0 {
            eprintln!(
                "trace: {} / {} tokens ({:.1} tok/s)",
                i + 1,
                tokens.len(),
                (i + 1) as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
