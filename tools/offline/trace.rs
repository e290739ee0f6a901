//! Activation traces: the file `leanstream trace` writes the engine's tap (`engine::tap`) to,
//! token by token, and its reader (the statistics in `trace_stats` read it).
//!
//! The file is safetensors (little-endian f32, C order), T tokens, L layers, K stages:
//!
//! | tensor | shape | what |
//! |---|---|---|
//! | `tokens` | [T] I32 | the token at each position |
//! | `positions` | [T] I32 | its position in its window (the KV cache restarts each window) |
//! | `ffn_residual` | [T, L, dim] | x_n, the residual entering layer n's FFN |
//! | `ffn_input` | [T, L, dim] | h_n = rmsnorm(x_n) * ffn_norm, the FFN's input |
//! | `stage_residual_priority` | [T, L, K, dim] | x_n + sum of stages 1..=k (paper eq. 2), stages in descending |activation| |
//! | `stage_residual_index` | [T, L, K, dim] | the same with stages in neuron index order (the "arbitrary" order) |
//! | `gate_act` | [T, L, hidden] | SiLU(gate) of every neuron |
//! | `neuron_act` | [T, L, hidden] | SiLU(gate) * up of every neuron (its magnitude is the oracle's score) |
//!
//! The stages split the neurons the oracle keeps at the trace's sparsity (|SiLU(gate) * up| at
//! or over the layer's calibrated threshold; every neuron at sparsity 0) into K groups of equal
//! count (the first groups one larger when K does not divide it). `__metadata__` names the model,
//! its table identity, K, the sparsity, the text and the window.

use leanstream::engine::tap::Tap;

/// One tensor of a trace file: its name, shape, and bytes per token.
struct TensorSpec {
    name: &'static str,
    dtype: &'static str,
    /// Shape after the leading token axis.
    inner: Vec<usize>,
    offset: u64,
}

impl TensorSpec {
    fn token_bytes(&self) -> u64 {
        4 * self.inner.iter().product::<usize>() as u64
    }
}

/// What a trace file says about itself (`__metadata__`).
#[derive(Clone, Debug, Default)]
pub struct TraceMeta {
    pub model: String,
    pub identity: u64,
    pub text: String,
    pub skip_tokens: usize,
    pub ctx: usize,
    pub sparsity: f32,
}

/// Writes a trace token by token at fixed offsets: memory stays one token's record however
/// long the text.
pub struct TraceWriter {
    file: std::fs::File,
    tensors: Vec<TensorSpec>,
    tokens: usize,
    buf: Vec<u8>,
}

fn spec_list(l: usize, dim: usize, hidden: usize, k: usize) -> Vec<TensorSpec> {
    let t = |name, dtype, inner: Vec<usize>| TensorSpec {
        name,
        dtype,
        inner,
        offset: 0,
    };
    vec![
        t("tokens", "I32", vec![]),
        t("positions", "I32", vec![]),
        t("ffn_residual", "F32", vec![l, dim]),
        t("ffn_input", "F32", vec![l, dim]),
        t("stage_residual_priority", "F32", vec![l, k, dim]),
        t("stage_residual_index", "F32", vec![l, k, dim]),
        t("gate_act", "F32", vec![l, hidden]),
        t("neuron_act", "F32", vec![l, hidden]),
    ]
}

impl TraceWriter {
    /// Creates `path` for `tokens` tokens of a tap's shape; returns the writer and the bytes
    /// per token.
    pub fn create(
        path: &std::path::Path,
        tap: &Tap,
        tokens: usize,
        meta: &TraceMeta,
    ) -> Result<(TraceWriter, u64), String> {
        let mut tensors = spec_list(tap.n_layers, tap.dim, tap.hidden, tap.stages);
        let mut at = 0u64;
        let mut header = String::from("{\"__metadata__\":{");
        header.push_str(&format!(
            "\"format\":\"leanstream-trace-1\",\"model\":{:?},\"identity\":\"{:016x}\",\"text\":{:?},\"skip_tokens\":\"{}\",\"ctx\":\"{}\",\"stages\":\"{}\",\"sparsity\":\"{}\",\"layers\":\"{}\",\"dim\":\"{}\",\"hidden\":\"{}\"}}",
            meta.model, meta.identity, meta.text, meta.skip_tokens, meta.ctx, tap.stages, meta.sparsity, tap.n_layers, tap.dim, tap.hidden
        ));
        for t in tensors.iter_mut() {
            t.offset = at;
            let end = at + t.token_bytes() * tokens as u64;
            let shape: Vec<String> = std::iter::once(tokens)
                .chain(t.inner.iter().copied())
                .map(|d| d.to_string())
                .collect();
            header.push_str(&format!(
                ",\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{at},{end}]}}",
                t.name,
                t.dtype,
                shape.join(",")
            ));
            at = end;
        }
        header.push('}');
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let base = 8 + header.len() as u64;
        for t in tensors.iter_mut() {
            t.offset += base;
        }
        let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        use std::os::unix::fs::FileExt;
        let mut head = (header.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(header.as_bytes());
        file.write_all_at(&head, 0)
            .and_then(|_| file.set_len(base + at))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let per_token = tensors.iter().map(|t| t.token_bytes()).sum::<u64>();
        Ok((
            TraceWriter {
                file,
                tensors,
                tokens,
                buf: Vec::new(),
            },
            per_token,
        ))
    }

    /// Writes token `t` (its id, its position in its window, and the tap's record).
    pub fn write(&mut self, t: usize, token: u32, pos: usize, tap: &Tap) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        assert!(t < self.tokens);
        for spec in &self.tensors {
            self.buf.clear();
            let src: &[f32] = match spec.name {
                "tokens" => {
                    self.buf.extend_from_slice(&(token as i32).to_le_bytes());
                    &[]
                }
                "positions" => {
                    self.buf.extend_from_slice(&(pos as i32).to_le_bytes());
                    &[]
                }
                "ffn_residual" => tap.residual,
                "ffn_input" => tap.input,
                "stage_residual_priority" => tap.stage_priority,
                "stage_residual_index" => tap.stage_index,
                "gate_act" => tap.gate_act,
                _ => tap.neuron_act,
            };
            for v in src {
                self.buf.extend_from_slice(&v.to_le_bytes());
            }
            debug_assert_eq!(self.buf.len() as u64, spec.token_bytes().max(4));
            self.file
                .write_all_at(&self.buf, spec.offset + t as u64 * self.buf.len() as u64)
                .map_err(|e| format!("trace: {e}"))?;
        }
        Ok(())
    }
}

/// A trace file opened for reading (memory-mapped).
pub struct TraceReader {
    map: memmap2::Mmap,
    base: usize,
    pub header: serde_json::Value,
    pub tokens: usize,
    pub layers: usize,
    pub dim: usize,
    pub hidden: usize,
    pub stages: usize,
}

impl TraceReader {
    pub fn open(path: &std::path::Path) -> Result<TraceReader, String> {
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: the file is only read; a trace is not modified while it is analysed.
        let map =
            unsafe { memmap2::Mmap::map(&f) }.map_err(|e| format!("{}: {e}", path.display()))?;
        let bad = |m: &str| format!("{}: not a LeanStream trace ({m})", path.display());
        if map.len() < 8 {
            return Err(bad("short"));
        }
        let n = u64::from_le_bytes(map[..8].try_into().unwrap()) as usize;
        if n > map.len() - 8 {
            return Err(bad("header length"));
        }
        let header: serde_json::Value =
            serde_json::from_slice(&map[8..8 + n]).map_err(|e| bad(&e.to_string()))?;
        let meta = |k: &str| -> Result<usize, String> {
            header["__metadata__"][k]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad(&format!("metadata {k}")))
        };
        let r = TraceReader {
            base: 8 + n,
            tokens: header["tokens"]["shape"][0]
                .as_u64()
                .ok_or_else(|| bad("tokens"))? as usize,
            layers: meta("layers")?,
            dim: meta("dim")?,
            hidden: meta("hidden")?,
            stages: meta("stages")?,
            header,
            map,
        };
        for (name, ..) in [
            ("ffn_residual", 0),
            ("stage_residual_priority", 0),
            ("neuron_act", 0),
        ] {
            r.tensor(name)?;
        }
        Ok(r)
    }

    pub fn meta(&self, k: &str) -> Option<&str> {
        self.header["__metadata__"][k].as_str()
    }

    /// The f32 (or i32, reinterpreted) data of a tensor, all tokens.
    pub fn tensor(&self, name: &str) -> Result<&[f32], String> {
        let t = &self.header[name];
        let (a, b) = (
            t["data_offsets"][0]
                .as_u64()
                .ok_or(format!("trace has no tensor {name}"))? as usize,
            t["data_offsets"][1]
                .as_u64()
                .ok_or(format!("trace has no tensor {name}"))? as usize,
        );
        if b < a
            || self.base + b > self.map.len()
            || (b - a) % 4 != 0
            || !(self.base + a).is_multiple_of(4)
        {
            return Err(format!("trace tensor {name}: bad offsets"));
        }
        let bytes = &self.map[self.base + a..self.base + b];
        // SAFETY: 4-byte aligned (checked above; the mapping is page-aligned), whole f32s, and
        // every bit pattern is a valid f32.
        Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), bytes.len() / 4) })
    }

    /// Token `t`'s position in its window.
    pub fn position(&self, t: usize) -> Result<i32, String> {
        Ok(self.tensor("positions")?[t].to_bits() as i32)
    }
}
