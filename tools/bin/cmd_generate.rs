//! `leanstream generate`: text after a prompt (or a chat turn), on the CPU or CUDA backend.

use super::*;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt; "" starts from BOS.
    #[arg(long, allow_hyphen_values = true)]
    prompt: String,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    chat: bool,
    /// Most tokens to generate (fewer if the context ends first; 0 only encodes the prompt).
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// 0 keeps every token.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely tokens whose probabilities add up to P (1 keeps every
    /// token).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Random seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this text is generated (may repeat, up to 4).
    #[arg(long)]
    stop: Vec<String>,
}

/// The prompt's tokens: plain text or the chat template, BOS as the model wants it.
fn prompt_tokens(
    tok: &Tokenizer,
    file: &ModelFile,
    prompt: &str,
    chat: bool,
) -> Result<Vec<u32>, String> {
    if chat {
        let template = match file {
            ModelFile::Gguf(g) => g.get_str("tokenizer.chat_template"),
            ModelFile::Llama2c(_) => None,
        };
        let format = ChatFormat::detect(template).map_err(|e| e.to_string())?;
        // Control tokens only from the template's markers: the prompt is plain text.
        let (_, ids) = tok.encode_chat(
            &format,
            &[ChatMessage {
                role: "user",
                content: prompt,
            }],
            true,
            tok.add_bos_default(),
        );
        return Ok(ids);
    }
    // An empty prompt starts from BOS.
    let add_bos = tok.add_bos_default() || prompt.is_empty();
    Ok(tok.encode(prompt, add_bos))
}

pub fn cmd_generate(a: GenerateArgs) -> Result<(), String> {
    let (file, tok) = open_model(&a.model.model, a.model.tokenizer.as_deref())?;
    let sampler_cfg = SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    sampler_cfg.check()?;
    let prompt = prompt_tokens(&tok, &file, &a.prompt, a.chat)?;
    let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
    let mut engine = boot(&mut arenas, &file, &a.model)?;
    drop(file);
    // A prompt that leaves no room is refused by `generate` itself.
    let room = engine.decoder().context().saturating_sub(prompt.len());
    if a.max_tokens > room && room > 0 {
        eprintln!(
            "note: --max-tokens {} is past the context of {} tokens ({} of them the prompt): at most {room} are generated",
            a.max_tokens,
            engine.decoder().context(),
            prompt.len()
        );
    }
    let idx = engine.take_sample_buffer().expect("fresh engine");
    let mut sampler = Sampler::new(sampler_cfg, idx);
    let stops: Vec<&str> = a.stop.iter().map(String::as_str).collect();
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        stop: &stops,
        deadline: None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stats = generate(
        engine.decoder(),
        &mut sampler,
        &tok,
        &prompt,
        &params,
        &mut |bytes| out.write_all(bytes).and_then(|_| out.flush()).is_ok(),
    )
    .map_err(|e| e.to_string())?;
    let _ = writeln!(out);
    if let Some(e) = stats.error {
        return Err(format!("the FFN stream from the flash image failed: {e}"));
    }
    let streamed = engine
        .decoder()
        .stream_stats()
        .map(|st| {
            format!(
                " | streamed FFN: cache hit ratio {:.3}, {:.0} bytes read per token, I/O wait {:.2} ms per token",
                st.hit_ratio(),
                st.bytes_per_token(),
                st.io_wait_ms_per_token()
            )
        })
        .unwrap_or_default();
    eprintln!("{} | {}{streamed}", stats_line(&stats), engine.describe());
    Ok(())
}

fn stats_line(s: &GenerateStats) -> String {
    // The prompt is run with the first step: with no step, there is no speed to report; with
    // one, no decode speed (the first token comes out of the prefill).
    if s.generated_tokens == 0 {
        return format!(
            "prefill: {} tokens, not run (no token generated) | decode: 0 tokens | finish: {}",
            s.prompt_tokens,
            s.finish.as_str()
        );
    }
    if s.generated_tokens == 1 {
        return format!(
            "prefill: {} tokens, {:.1} tok/s | decode: 1 token (from the prefill) | finish: {}",
            s.prompt_tokens,
            s.prefill_tok_per_s(),
            s.finish.as_str()
        );
    }
    format!(
        "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s | finish: {}",
        s.prompt_tokens,
        s.prefill_tok_per_s(),
        s.generated_tokens,
        s.decode_tok_per_s(),
        s.finish.as_str()
    )
}
