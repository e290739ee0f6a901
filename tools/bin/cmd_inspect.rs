//! `leanstream inspect`: a model file's architecture, shapes, tensor types and bytes per part.

use super::*;

pub fn cmd_inspect(path: &Path) -> Result<(), String> {
    // The report is built whole, then written once: a reader that stops early (`| head`) ends
    // the command quietly instead of a panic in the middle of a line.
    let mut report = String::new();
    macro_rules! out {
        ($($t:tt)*) => {{
            use std::fmt::Write as _;
            // Writing into a String cannot fail.
            let _ = writeln!(report, $($t)*);
        }};
    }
    let file = ModelFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let h = file
        .hyper()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    out!("file: {}", path.display());
    out!(
        "format: {}",
        match &file {
            ModelFile::Gguf(g) => format!("GGUF v{} (alignment {})", g.version, g.alignment),
            ModelFile::Llama2c(_) => "llama2.c checkpoint (f32)".to_string(),
        }
    );
    out!("architecture: {:?}", h.arch);
    out!(
        "layers {} | dim {} | ffn {} | heads {} / kv heads {} | head_dim {} | vocab {} | context {}",
        h.n_layers, h.dim, h.hidden_dim, h.n_heads, h.n_kv_heads, h.head_dim, h.vocab_size, h.ctx_train
    );
    out!(
        "rope {:?} base {} | rms eps {:e} | output {} | q/k/v bias {}",
        h.rope_style,
        h.rope_base,
        h.norm_eps,
        if h.tied_output {
            "tied to embeddings"
        } else {
            "own tensor"
        },
        h.qkv_bias
    );
    let names: Vec<String> = match &file {
        ModelFile::Gguf(g) => g.tensors.iter().map(|t| t.name.clone()).collect(),
        ModelFile::Llama2c(_) => ModelFile::expected_tensors(&h)
            .into_iter()
            .map(|(n, _, _)| n)
            .collect(),
    };
    let mut parts: [(&str, usize); 4] = [
        ("embeddings + output", 0),
        ("attention", 0),
        ("ffn", 0),
        ("norms", 0),
    ];
    let mut by_type: Vec<(String, usize, usize)> = Vec::new();
    out!(
        "\n{:<28} {:>6} {:>16} {:>12}",
        "tensor",
        "type",
        "shape",
        "bytes"
    );
    for name in &names {
        let t = file.tensor(name).map_err(|e| e.to_string())?;
        out!(
            "{:<28} {:>6} {:>16} {:>12}",
            name,
            t.ty.name(),
            format!("{}x{}", t.cols, t.rows),
            t.data.len()
        );
        let part =
            if name.contains("ffn_gate") || name.contains("ffn_up") || name.contains("ffn_down") {
                2
            } else if name.contains("attn_q")
                || name.contains("attn_k")
                || name.contains("attn_v")
                || name.contains("attn_output")
            {
                1
            } else if name.contains("norm") {
                3
            } else {
                0
            };
        parts[part].1 += t.data.len();
        match by_type.iter_mut().find(|(n, _, _)| n == t.ty.name()) {
            Some(e) => {
                e.1 += 1;
                e.2 += t.data.len();
            }
            None => by_type.push((t.ty.name().to_string(), 1, t.data.len())),
        }
    }
    out!("\nbytes per part:");
    for (name, bytes) in parts {
        out!(
            "  {:<22} {:>12} ({:.1} MiB)",
            name,
            bytes,
            bytes as f64 / 1048576.0
        );
    }
    out!("tensor types:");
    for (ty, n, bytes) in by_type {
        out!("  {:<6} {:>4} tensors {:>12} bytes", ty, n, bytes);
    }
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}
