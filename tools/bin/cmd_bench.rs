//! `leanstream bench`: prefill and decode speed of configurations side by side (CPU and CUDA
//! backends, precisions, sparse FFN modes, long context), written as JSON, Markdown and PNG.

use super::*;

#[derive(Args)]
pub struct BenchArgs {
    /// Model files, comma-separated (each is run in every configuration); a flash image
    /// (`--image`) streams its FFN (sparse --ffn only).
    #[arg(long, alias = "image", value_delimiter = ',', required = true)]
    model: Vec<PathBuf>,
    /// Tokenizer file for llama2.c checkpoints.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Backends, comma-separated: cpu, cuda.
    #[arg(long, value_delimiter = ',', default_value = "cpu")]
    backend: Vec<String>,
    #[command(flatten)]
    low: LowBitArgs,
    /// FFN configurations (`--ffn`, `--score`, `--sparsity` lists) run side by side on the CPU
    /// when `--ffn` names a sparse mode.
    #[command(flatten)]
    sparsity: SparsityArgs,
    #[command(flatten)]
    stream: StreamArgs,
    /// CUDA memory models, comma-separated: unified, discrete (default: the board's).
    #[arg(long, value_delimiter = ',')]
    memory: Vec<String>,
    /// CPU worker threads (default: the board's cpu_threads).
    #[arg(long)]
    threads: Option<usize>,
    /// Prompt length in tokens (the prefill measured).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens generated after the prompt (the decode measured).
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Where to write the JSON result.
    #[arg(long, default_value = "bench.json")]
    json: PathBuf,
    /// Where to write the Markdown table.
    #[arg(long, default_value = "bench.md")]
    markdown: PathBuf,
    /// Where to write the PNG plot.
    #[arg(long, default_value = "bench.png")]
    png: PathBuf,
    /// Configurations to run side by side, comma-separated: PRECISION[/PACKING][+LAYOUT],
    /// layouts `no-adaptive-kv` (one token-major KV segment) and `head-tiles` (one head-tiled
    /// segment); e.g. `native,f16,w8a8,w4a8/swizzled+no-adaptive-kv`. `--ablate` adds each
    /// configuration again with each CPU ablation.
    /// Default: the one configuration the model flags give.
    #[arg(long)]
    configs: Option<String>,
    /// Long-context mode: decode positions 0..N one token at a time (N capped at the context)
    /// and report latency per 512-token window instead of prefill/decode rates.
    #[arg(long)]
    long_context: Option<usize>,
}

/// One bench configuration: its label and low-bit options.
fn parse_config(spec: &str, base: &LowBitArgs) -> Result<(String, LowBitArgs), String> {
    let mut low = base.clone();
    low.ablate.clear();
    low.kv_layout = "adaptive".into();
    let mut parts = spec.split('+');
    let head = parts.next().unwrap_or_default();
    let (prec, pack) = match head.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (head, None),
    };
    low.precision = Precision::parse(prec)?;
    if let Some(p) = pack {
        low.packing = leanstream::backend::cpu::parse_packing(p)?;
    }
    for flag in parts {
        match flag {
            "no-adaptive-kv" => low.kv_layout = "token-major".into(),
            "head-tiles" => low.kv_layout = "head-tiles".into(),
            _ => {
                return Err(format!(
                    "unknown bench flag '{flag}' in '{spec}' (no-adaptive-kv, head-tiles; ablations go in --ablate)"
                ))
            }
        }
    }
    let label = if low.precision == Precision::W4a8 && !spec.contains('/') {
        format!("{spec} ({})", low.packing.name())
    } else {
        spec.to_string()
    };
    Ok((label, low))
}

pub fn cmd_bench(a: BenchArgs) -> Result<(), String> {
    if a.sparsity.ffn.split(',').any(|m| m.trim() != "dense") {
        if a.model.len() != 1
            || a.backend.iter().any(|b| b != "cpu")
            || a.configs.is_some()
            || a.long_context.is_some()
            || !a.low.ablate.is_empty()
        {
            return Err(
                "the sparse FFN runs on the CPU backend only for now: sparse --ffn takes one model on the cpu backend, without --configs, --long-context or --ablate".into(),
            );
        }
        return cmd_bench_ffn(a);
    }
    if a.long_context.is_some() && a.backend.iter().any(|b| b == "cuda") {
        if a.model.len() != 1 || a.backend.len() != 1 || a.configs.is_some() {
            return Err(
                "--long-context on the cuda backend takes one model and no --configs".into(),
            );
        }
        return cmd_bench_long_cuda(a);
    }
    if a.configs.is_some() || a.long_context.is_some() {
        if a.model.len() != 1 || a.backend.iter().any(|b| b != "cpu") {
            return Err("--configs and --long-context take one model on the cpu backend".into());
        }
        return cmd_bench_configs(a);
    }
    cmd_bench_backends(a)
}

/// Models x backends x memory models (x graph on/off), at the model flags' precision.
fn cmd_bench_backends(a: BenchArgs) -> Result<(), String> {
    use leanstream_tools::bench;
    let threads = a
        .threads
        .map(threads_at_least_one)
        .unwrap_or(leanstream::board::CPU_THREADS);
    let memories = if a.memory.is_empty() {
        vec![CudaOptions::default().memory]
    } else {
        a.memory
            .iter()
            .map(|m| parse_memory(m))
            .collect::<Result<_, _>>()?
    };
    let mut configs = Vec::new();
    for model in &a.model {
        for b in &a.backend {
            let backend = Backend::parse(b)?;
            let base = bench::Config {
                model: model.clone(),
                tokenizer: a.tokenizer.clone(),
                backend,
                memory: MemoryModel::None,
                threads,
                precision: a.low.precision,
                packing: a.low.packing,
                ablation: None,
            };
            // Each ablation of this backend is timed beside its configuration.
            let ablations = a.low.ablate.iter().filter(|x| x.backend() == backend);
            let variants: Vec<Option<Ablation>> = std::iter::once(None)
                .chain(ablations.map(|x| Some(*x)))
                .collect();
            match backend {
                Backend::Cpu => {
                    for ablation in variants {
                        configs.push(bench::Config {
                            ablation,
                            ..base.clone()
                        });
                    }
                }
                Backend::Cuda => {
                    for &memory in &memories {
                        for &ablation in &variants {
                            configs.push(bench::Config {
                                memory,
                                ablation,
                                ..base.clone()
                            });
                        }
                    }
                }
            }
        }
    }
    let settings = bench::Settings {
        prompt_tokens: a.prompt_tokens,
        gen_tokens: a.gen_tokens,
        reps: a.reps,
    };
    let copy_gbps = if configs.iter().any(|c| c.backend == Backend::Cuda) {
        leanstream::engine::any::probe_cuda()?;
        let bw = bench::copy_bandwidth_gbps()?;
        eprintln!("device-to-device copy: {bw:.0} GB/s");
        Some(bw)
    } else {
        None
    };
    let rows = bench::run(&configs, &settings, copy_gbps, &mut |line| {
        eprintln!("{line}")
    })?;
    let md = bench::markdown(&rows, copy_gbps);
    let json = bench::json(&rows, copy_gbps, &settings);
    std::fs::write(&a.json, &json).map_err(|e| format!("{}: {e}", a.json.display()))?;
    std::fs::write(&a.markdown, &md).map_err(|e| format!("{}: {e}", a.markdown.display()))?;
    let title = format!(
        "leanstream bench on {} ({} prompt, {} generated tokens)",
        leanstream::board::NAME,
        a.prompt_tokens,
        a.gen_tokens
    );
    bench::plot::decode_bars(&rows, &title, &a.png)?;
    print!("{md}");
    Ok(())
}

/// The one model of a CPU-only bench (sparse FFN configurations, `--configs`, long context) as
/// the model options the other commands take.
fn cpu_model_args(a: &BenchArgs) -> ModelArgs {
    ModelArgs {
        model: a.model[0].clone(),
        tokenizer: a.tokenizer.clone(),
        threads: a.threads.map(threads_at_least_one),
        backend: "cpu".into(),
        memory: None,
        low: a.low.clone(),
        sparsity: a.sparsity.clone(),
        stream: a.stream.clone(),
    }
}

/// A model path's file name, for the tables.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Prefill and decode speed of every configuration the sparsity options name, side by side in
/// one process: each configuration has its own engine, and the repetitions alternate between
/// them so that a busy moment of the machine touches all of them alike.
fn cmd_bench_ffn(a: BenchArgs) -> Result<(), String> {
    let model = cpu_model_args(&a);
    let (file, tok) = open_model(&model.model, model.tokenizer.as_deref())?;
    let configs = model.sparsity.configs(&model.model, &file)?;
    let name = file_name(&model.model);
    let prompt = bench_prompt(&tok, a.prompt_tokens);
    let mut arenas: Vec<Arenas> = configs
        .iter()
        .map(|_| Arenas::from_board().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut engines: Vec<Engine> = arenas
        .iter_mut()
        .zip(&configs)
        .enumerate()
        .map(|(i, (ar, c))| boot_cpu(ar, &file, &model, &model.low, c.clone(), i == 0))
        .collect::<Result<_, _>>()?;
    drop(file);
    if prompt.len() + a.gen_tokens > engines[0].context {
        return Err(format!(
            "prompt + gen tokens ({}) exceed the context ({})",
            prompt.len() + a.gen_tokens,
            engines[0].context
        ));
    }
    let mut samplers: Vec<Sampler> = engines
        .iter_mut()
        .map(|e| {
            Sampler::new(
                SamplerConfig::default(),
                e.take_sample_buffer().expect("fresh engine"),
            )
        })
        .collect();
    // Greedy decoding may hit end-of-text early; decode a fixed count by forwarding sampled
    // tokens directly.
    let mut prefill = vec![Vec::new(); configs.len()];
    let mut decode = vec![Vec::new(); configs.len()];
    let mut dropped = vec![0.0; configs.len()];
    for _ in 0..a.reps.max(1) {
        for (i, (engine, sampler)) in engines.iter_mut().zip(samplers.iter_mut()).enumerate() {
            let t0 = Instant::now();
            let logits_token = sampler.sample(engine.prefill(&prompt, 0));
            let t1 = Instant::now();
            engine.take_ffn_counts();
            let mut token = logits_token;
            for j in 0..a.gen_tokens {
                token = sampler.sample(engine.forward(token, prompt.len() + j));
            }
            let t2 = Instant::now();
            if let Some((kept, seen)) = engine.take_ffn_counts() {
                dropped[i] = 1.0 - kept as f64 / seen.max(1) as f64;
            }
            prefill[i].push(prompt.len() as f64 / (t1 - t0).as_secs_f64());
            decode[i].push(a.gen_tokens as f64 / (t2 - t1).as_secs_f64());
        }
    }
    let threads = engines[0].threads();
    for (c, e) in configs.iter().zip(&engines) {
        if let Some(s) = e.stream() {
            let st = s.stats();
            println!(
                "{} streamed ({}{}): cache hit ratio {:.3}, {:.0} bytes read per token, I/O wait {:.2} ms per token",
                c.label(),
                s.backend_name(),
                if s.direct() { ", O_DIRECT" } else { "" },
                st.hit_ratio(),
                st.bytes_per_token(),
                st.io_wait_ms_per_token()
            );
        }
    }
    let p: Vec<f64> = prefill.into_iter().map(median).collect();
    let d: Vec<f64> = decode.iter().cloned().map(median).collect();
    // Against dense: the median over repetitions of the ratio within each repetition (the
    // configurations of one repetition run back to back, so a slow moment of the machine
    // touches both sides of a ratio).
    let dense_at = configs.iter().position(|c| c.mode == FfnMode::Dense);
    let vs_dense: Vec<Option<f64>> = decode
        .iter()
        .map(|runs| {
            dense_at.map(|b| median(runs.iter().zip(&decode[b]).map(|(x, y)| x / y).collect()))
        })
        .collect();
    let mut rows = Vec::new();
    let mut md = String::from("| model | backend | threads | ffn | neurons dropped | prompt tokens | gen tokens | prefill tok/s | decode tok/s | decode vs dense |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (i, c) in configs.iter().enumerate() {
        let ratio = vs_dense[i];
        rows.push(format!(
            "    {{\"ffn\": \"{}\", \"neurons_dropped\": {:.4}, \"prefill_tok_per_s\": {:.2}, \"decode_tok_per_s\": {:.2}, \"decode_vs_dense\": {}}}",
            c.label(),
            dropped[i],
            p[i],
            d[i],
            ratio.map(|r| format!("{r:.3}")).unwrap_or_else(|| "null".into())
        ));
        md.push_str(&format!(
            "| {name} | cpu | {threads} | {} | {:.2} | {} | {} | {:.1} | {:.1} | {} |\n",
            c.label(),
            dropped[i],
            prompt.len(),
            a.gen_tokens,
            p[i],
            d[i],
            ratio
                .map(|r| format!("{r:.2}x"))
                .unwrap_or_else(|| "-".into())
        ));
    }
    let json = format!(
        "{{\n  \"model\": {:?},\n  \"backend\": \"cpu\",\n  \"threads\": {threads},\n  \"board\": {:?},\n  \"prompt_tokens\": {},\n  \"gen_tokens\": {},\n  \"reps\": {},\n  \"prefill_tok_per_s\": {:.2},\n  \"decode_tok_per_s\": {:.2},\n  \"configs\": [\n{}\n  ]\n}}\n",
        name,
        leanstream::board::NAME,
        prompt.len(),
        a.gen_tokens,
        a.reps,
        p[0],
        d[0],
        rows.join(",\n")
    );
    write_tables(&a, &json, &md)
}

/// Low-bit configurations of one model on the CPU (`--configs`, `--long-context`).
fn cmd_bench_configs(a: BenchArgs) -> Result<(), String> {
    let model = cpu_model_args(&a);
    let (file, tok) = open_model(&model.model, model.tokenizer.as_deref())?;
    let ffn = model.sparsity.single(&model.model, &file)?;
    let name = file_name(&model.model);
    let mut configs: Vec<(String, LowBitArgs)> = match &a.configs {
        None => {
            let mut low = model.low.clone();
            low.ablate.clear();
            vec![(model.low.precision.to_string(), low)]
        }
        Some(list) => list
            .split(',')
            .map(|c| parse_config(c.trim(), &model.low))
            .collect::<Result<_, _>>()?,
    };
    // Each CPU ablation is timed beside each configuration, labelled `CONFIG+ABLATION`.
    let plain = configs.len();
    for ablation in a.low.ablate.iter().filter(|x| x.backend() == Backend::Cpu) {
        for i in 0..plain {
            let (label, low) = &configs[i];
            let mut low = low.clone();
            low.ablate = vec![*ablation];
            configs.push((format!("{label}+{}", ablation.name()), low));
        }
    }
    let prompt = bench_prompt(&tok, a.prompt_tokens);
    // Every configuration is booted at once, each in its own arenas (mapped at the board's
    // budgets, backed only where touched), and the repetitions go round-robin over them, so a
    // busy moment of the machine lands on all of them alike.
    let mut arenas: Vec<Arenas> = configs
        .iter()
        .map(|_| Arenas::from_board().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut engines = Vec::new();
    for (ar, (_, low)) in arenas.iter_mut().zip(&configs) {
        let mut engine = boot_cpu(ar, &file, &model, low, ffn.clone(), true)?;
        let idx = engine.take_sample_buffer().expect("fresh engine");
        engines.push((engine, Sampler::new(SamplerConfig::default(), idx)));
    }
    drop(file);
    let threads = engines[0].0.threads();
    let mut rows_json = Vec::new();
    let mut rows_md = Vec::new();
    if let Some(n) = a.long_context {
        for ((engine, sampler), (label, _)) in engines.iter_mut().zip(&configs) {
            let step = |e: &mut Engine, t: u32, p: usize| sampler.sample(e.forward(t, p));
            let (json, md) = long_context(engine, step, &prompt, n, label, segments_text)?;
            rows_json.push(json);
            rows_md.push(md);
        }
    } else {
        let context = engines[0].0.context;
        if prompt.len() + a.gen_tokens > context {
            return Err(format!(
                "prompt + gen tokens ({}) exceed the context ({context})",
                prompt.len() + a.gen_tokens,
            ));
        }
        // The prompt (batched, then its last token's logits) for each configuration in turn;
        // then decode token by token, every configuration in turn: on a shared machine a busy
        // moment then lands on all of them alike. Greedy decoding may hit end-of-text early;
        // decode a fixed count by forwarding sampled tokens directly.
        let mut prefill = vec![Vec::new(); configs.len()];
        let mut decode = vec![Vec::new(); configs.len()];
        let n = configs.len();
        for _ in 0..a.reps.max(1) {
            let (mut tp, mut td) = (vec![0f64; n], vec![0f64; n]);
            let mut next = vec![0u32; n];
            for (i, (engine, sampler)) in engines.iter_mut().enumerate() {
                let t0 = Instant::now();
                next[i] = sampler.sample(engine.prefill(&prompt, 0));
                tp[i] = t0.elapsed().as_secs_f64();
            }
            for pos in prompt.len()..prompt.len() + a.gen_tokens {
                for (i, (engine, sampler)) in engines.iter_mut().enumerate() {
                    let t0 = Instant::now();
                    next[i] = sampler.sample(engine.forward(next[i], pos));
                    td[i] += t0.elapsed().as_secs_f64();
                }
            }
            for i in 0..n {
                prefill[i].push(prompt.len() as f64 / tp[i]);
                decode[i].push(a.gen_tokens as f64 / td[i]);
            }
        }
        let mut base = None;
        for (i, (engine, _)) in engines.iter().enumerate() {
            let label = &configs[i].0;
            let (p, d) = (median(prefill[i].clone()), median(decode[i].clone()));
            let ms = 1000.0 / d;
            let base = *base.get_or_insert(ms);
            let segs = segments_text(engine);
            rows_json.push(format!(
                "    {{\"config\": {label:?}, \"prefill_tok_per_s\": {p:.2}, \"decode_tok_per_s\": {d:.2}, \"decode_ms_per_token\": {ms:.3}, \"vs_first\": {:.3}, \"kv_segments\": {segs:?}}}",
                base / ms
            ));
            rows_md.push(format!(
                "| {label} | {p:.1} | {d:.1} | {ms:.2} | {:.2}x | {segs} |",
                base / ms
            ));
        }
    }
    let header = if a.long_context.is_some() {
        long_context_header("KV segments")
    } else {
        "| config | prefill tok/s | decode tok/s | decode ms/token | speed vs first row | KV segments |\n|---|---|---|---|---|---|".into()
    };
    let json = format!(
        "{{\n  \"model\": {:?},\n  \"backend\": \"cpu\",\n  \"threads\": {threads},\n  \"board\": {:?},\n  \"prompt_tokens\": {},\n  \"gen_tokens\": {},\n  \"reps\": {},\n  \"long_context\": {},\n  \"configs\": [\n{}\n  ]\n}}\n",
        name,
        leanstream::board::NAME,
        prompt.len(),
        a.gen_tokens,
        a.reps,
        a.long_context.map_or("null".to_string(), |n| n.to_string()),
        rows_json.join(",\n")
    );
    let md = format!(
        "{name}, cpu, {threads} threads, board {}\n\n{header}\n{}\n",
        leanstream::board::NAME,
        rows_md.join("\n")
    );
    write_tables(&a, &json, &md)
}

/// A fixed, ordinary English prompt of `n` tokens, repeated to length (speed does not depend
/// on it).
pub(super) fn bench_prompt(tok: &leanstream::tokenizer::Tokenizer, n: usize) -> Vec<u32> {
    let seed_text = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small town by the sea, there lived a curious child who loved to read about the stars. ";
    let mut prompt = tok.encode(&seed_text.repeat(1 + n / 8), tok.add_bos_default());
    prompt.truncate(n.max(1));
    prompt
}

/// `--long-context N --backend cuda`: the latency per token from position 0 to N on the GPU,
/// each token's greedy pick made on the device, per 512-token window as the CPU's mode; each
/// CUDA ablation of `--ablate` (e.g. `no-split-attention`, `no-pdl`, `f32-kv`) beside it.
#[cfg(not(feature = "cuda"))]
fn cmd_bench_long_cuda(_: BenchArgs) -> Result<(), String> {
    Err(leanstream::engine::any::NO_CUDA.into())
}

#[cfg(feature = "cuda")]
fn cmd_bench_long_cuda(a: BenchArgs) -> Result<(), String> {
    let n = a.long_context.unwrap_or_default();
    let (file, tok) = open_model(&a.model[0], a.tokenizer.as_deref())?;
    let name = file_name(&a.model[0]);
    let prompt = bench_prompt(&tok, a.prompt_tokens);
    let mut base = CudaOptions {
        precision: a.low.precision,
        ..CudaOptions::default()
    };
    if let Some(m) = a.memory.first() {
        base.memory = parse_memory(m)?;
    }
    let mut configs = vec![("default".to_string(), base)];
    for ablation in a.low.ablate.iter().filter(|x| x.backend() == Backend::Cuda) {
        let mut o = base;
        ablation.apply_cuda(&mut o);
        configs.push((ablation.name(), o));
    }
    let (mut rows_json, mut rows_md, mut gpu) = (Vec::new(), Vec::new(), String::new());
    for (label, opts) in configs {
        let mut arenas = Arenas::from_board().map_err(|e| e.to_string())?;
        let mut engine = leanstream::engine::cuda::CudaEngine::boot(&mut arenas, &file, opts)
            .map_err(|e| format!("{label}: {e}"))?;
        gpu = engine.gpu.name.clone();
        let step =
            |e: &mut leanstream::engine::cuda::CudaEngine, t: u32, p: usize| e.forward_greedy(t, p);
        let kv = |e: &leanstream::engine::cuda::CudaEngine| {
            format!("{} token-major", e.kv_precision.name())
        };
        let (json, md) = long_context(&mut engine, step, &prompt, n, &label, kv)?;
        rows_json.push(json);
        rows_md.push(md);
    }
    let memory = leanstream_tools::bench::memory_name(base.memory);
    let json = format!(
        "{{\n  \"model\": {name:?},\n  \"backend\": \"cuda\",\n  \"gpu\": {gpu:?},\n  \"memory\": {memory:?},\n  \"board\": {:?},\n  \"long_context\": {n},\n  \"configs\": [\n{}\n  ]\n}}\n",
        leanstream::board::NAME,
        rows_json.join(",\n")
    );
    let md = format!(
        "{name}, cuda {gpu}, {memory} memory, board {}\n\n{}\n{}\n",
        leanstream::board::NAME,
        long_context_header("KV cache"),
        rows_md.join("\n")
    );
    write_tables(&a, &json, &md)
}

/// The Markdown header of `long_context`'s rows (`kv`: what its last column describes).
fn long_context_header(kv: &str) -> String {
    format!("| config | positions | first-window median ms | last-window median ms | growth | linear bound | worst p99/median (window) | {kv} |\n|---|---|---|---|---|---|---|---|")
}

/// Writes a bench's JSON and Markdown where `a` says, and prints the Markdown.
fn write_tables(a: &BenchArgs, json: &str, md: &str) -> Result<(), String> {
    std::fs::write(&a.json, json).map_err(|e| format!("{}: {e}", a.json.display()))?;
    std::fs::write(&a.markdown, md).map_err(|e| format!("{}: {e}", a.markdown.display()))?;
    print!("{md}");
    Ok(())
}

/// The KV chain as `layout[start..end]` items (a float cache is one segment of rows a KV head
/// at a time: `head-major`, after its precision).
fn segments_text(e: &Engine) -> String {
    let kv = e.kv_precision();
    if kv != leanstream::kv::KvPrecision::I8 {
        let end = e.kv_segments().last().map_or(0, |s| s.start + s.len);
        return format!("{} head-major[0..{end}]", kv.name());
    }
    e.kv_segments()
        .iter()
        .map(|s| format!("{}[{}..{}]", s.layout.name(), s.start, s.start + s.len))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Decodes positions 0..n (the prompt's tokens, then sampled ones), timing each step; per
/// window of 512 positions, the median and p99. The linear bound is the growth the work
/// predicts: matrix MACs per token plus attention MACs growing with the position.
/// `step` runs one token and returns the next (the CPU samples its logits; the GPU picks the
/// greedy token on the device); `segs` describes the KV cache after the run.
fn long_context<D: Decoder>(
    engine: &mut D,
    mut step: impl FnMut(&mut D, u32, usize) -> u32,
    prompt: &[u32],
    n: usize,
    label: &str,
    segs: impl Fn(&D) -> String,
) -> Result<(String, String), String> {
    let n = n.min(engine.context());
    const W: usize = 512;
    if n < 2 * W {
        return Err(format!(
            "--long-context needs at least {} positions (context {})",
            2 * W,
            engine.context()
        ));
    }
    let mut ms = Vec::with_capacity(n);
    let mut token = prompt[0];
    for pos in 0..n {
        let t0 = Instant::now();
        let next = step(engine, token, pos);
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        token = if pos + 1 < prompt.len() {
            prompt[pos + 1]
        } else {
            next
        };
    }
    let mut worst = (0f64, 0usize);
    let mut medians = Vec::new();
    for (w, chunk) in ms.chunks(W).enumerate() {
        if chunk.len() < W {
            break;
        }
        let mut v = chunk.to_vec();
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        let p99 = v[(v.len() * 99) / 100];
        medians.push(med);
        if p99 / med > worst.0 {
            worst = (p99 / med, w);
        }
    }
    // The curve in finer steps (a median per 64 positions), for where the growth happens.
    let fine: Vec<f64> = ms
        .chunks(64)
        .map(|c| (median(c.to_vec()) * 1e4).round() / 1e4)
        .collect();
    let h = engine.hyper();
    let (q_dim, kv_dim) = (h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim);
    let matrix = (h.n_layers * (2 * h.dim * q_dim + 2 * h.dim * kv_dim + 3 * h.dim * h.hidden_dim)
        + h.vocab_size * h.dim) as f64;
    let attn_per_pos = (2 * h.n_layers * q_dim) as f64;
    let mid = |w: usize| (w * W + W / 2) as f64;
    let last = medians.len() - 1;
    let bound = (matrix + attn_per_pos * mid(last)) / (matrix + attn_per_pos * mid(0));
    let growth = medians[last] / medians[0];
    let segs = segs(engine);
    let json = format!(
        "    {{\"config\": {label:?}, \"positions\": {n}, \"window_median_ms\": {:?}, \"first_median_ms\": {:.3}, \"last_median_ms\": {:.3}, \"growth\": {growth:.3}, \"linear_bound\": {bound:.3}, \"worst_p99_over_median\": {:.3}, \"worst_window\": {}, \"kv_segments\": {segs:?}, \"median_ms_per_64\": {fine:?}}}",
        medians.iter().map(|m| (m * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        medians[0],
        medians[last],
        worst.0,
        worst.1
    );
    let md = format!(
        "| {label} | {n} | {:.2} | {:.2} | {growth:.2}x | {bound:.2}x | {:.2} ({}..{}) | {segs} |",
        medians[0],
        medians[last],
        worst.0,
        worst.1 * W,
        (worst.1 + 1) * W
    );
    Ok((json, md))
}
