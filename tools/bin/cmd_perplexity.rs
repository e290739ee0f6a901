//! `leanstream perplexity`: a text file's perplexity over non-overlapping windows, for one or more
//! FFN configurations.

use super::text_args::text_prefix;
use super::*;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score.
    #[arg(long)]
    file: PathBuf,
    /// Window length in tokens (the KV cache restarts for each window).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Number of windows (default: all).
    #[arg(long, default_value_t = 0)]
    chunks: usize,
    /// Also write every configuration's result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Perplexity of every configuration the sparsity options name, in one process: dense on its
/// own engine, the sparse ones on one engine with bundles (options switched between runs).
pub fn cmd_perplexity(a: PerplexityArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model.model, a.model.tokenizer.as_deref())?;
    let configs = a.model.sparsity.configs(&a.model.model, &file)?;
    if Backend::parse(&a.model.backend)? == Backend::Cuda
        && configs.iter().any(|c| c.mode != FfnMode::Dense)
    {
        return Err("the sparse FFN runs on the CPU backend only for now".into());
    }
    let text = std::fs::read(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let text = text_prefix(&text, a.chunks, a.ctx);
    let tokens = tok.encode(text, false);
    let mut results = Vec::new();
    let mut last = 0.0;
    for group in [false, true] {
        let mine: Vec<&FfnOptions> = configs
            .iter()
            .filter(|c| (c.mode != FfnMode::Dense) == group)
            .collect();
        let Some(first) = mine.first() else {
            continue;
        };
        let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
        let mut engine = boot_with(
            &mut arenas,
            &file,
            &a.model,
            &a.model.low,
            (*first).clone(),
            true,
        )?;
        for c in mine {
            if let Some(e) = engine.cpu() {
                e.set_ffn(c).map_err(|e| e.to_string())?;
                e.take_ffn_counts();
            }
            let label = c.label();
            let started = Instant::now();
            let r = perplexity(engine.decoder(), &tokens, a.ctx, a.chunks, &mut |w, p| {
                eprintln!("{label}: window {}: ppl {p:.4}", w + 1);
            })?;
            let secs = started.elapsed().as_secs_f64();
            let counts = engine.cpu().and_then(|e| e.take_ffn_counts());
            let measured = match counts {
                Some((kept, seen)) if seen > 0 => 1.0 - kept as f64 / seen as f64,
                _ => 0.0,
            };
            eprintln!(
                "{label}: {} windows of {} tokens, {} scored, {:.1} tok/s, neurons dropped {:.4}",
                r.windows,
                a.ctx,
                r.scored_tokens,
                r.scored_tokens as f64 / secs,
                measured
            );
            if configs.len() > 1 {
                println!("{label}: ppl = {:.4}", r.ppl);
            }
            results.push(format!(
                "    {{\"config\": \"{label}\", \"mode\": \"{}\", \"score\": \"{}\", \"sparsity\": {}, \"ppl\": {:.6}, \"dropped\": {:.6}, \"windows\": {}, \"scored_tokens\": {}, \"per_window\": [{}]}}",
                c.mode.name(),
                if c.mode == FfnMode::Dense { "-" } else { c.score.name() },
                c.sparsity,
                r.ppl,
                measured,
                r.windows,
                r.scored_tokens,
                r.per_window.iter().map(|p| format!("{p:.6}")).collect::<Vec<_>>().join(", ")
            ));
            last = r.ppl;
            write_ppl_json(&a, &results)?;
        }
    }
    println!("ppl = {last:.4}");
    Ok(())
}

/// Written after every configuration, so a long sweep that is stopped keeps what it measured.
fn write_ppl_json(a: &PerplexityArgs, results: &[String]) -> Result<(), String> {
    if let Some(path) = &a.json {
        let name = a
            .model
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let json = format!(
            "{{\n  \"model\": {name:?},\n  \"file\": {:?},\n  \"ctx\": {},\n  \"results\": [\n{}\n  ]\n}}\n",
            a.file.display().to_string(),
            a.ctx,
            results.join(",\n")
        );
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
