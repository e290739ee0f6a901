//! Model file formats: GGUF (v2/v3) and llama2.c checkpoints, and the GGML tensor types.
//!
//! [`ModelFile`] is the view the engine uses: hyperparameters ([`Hyper`]) and tensors
//! ([`TensorRef`]) under GGUF names, whatever the file format.

pub mod checksum;
pub mod flash;
pub mod ggml;
pub mod gguf;
pub mod llama2c;

pub use ggml::GgmlType;
pub use gguf::FormatError;

use std::io::Read;
use std::path::Path;

/// A file without the GGUF magic that does not read as a llama2.c checkpoint either: says both
/// (a README read as a checkpoint header would otherwise report a nonsense `dim`). I/O errors
/// pass through.
fn neither(head: &[u8], llama2c: FormatError) -> FormatError {
    if matches!(llama2c, FormatError::Io { .. }) {
        return llama2c;
    }
    let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    let why = llama2c.to_string();
    let why = why.strip_prefix("llama2.c checkpoint: ").unwrap_or(&why);
    FormatError::Model {
        msg: format!(
            "neither a GGUF file (it starts with bytes [{}] {:?}, not the magic \"GGUF\") nor a llama2.c checkpoint ({why})",
            hex.join(" "),
            String::from_utf8_lossy(head)
        ),
    }
}

/// Architectures the engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    /// The GGUF `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate `(x[2i], x[2i+1])`: llama in GGUF (ggml "normal" mode) and llama2.c.
    AdjacentPairs,
    /// Rotate `(x[i], x[i + head_dim/2])`: ggml NEOX mode, qwen2.
    HalfSplit,
}

impl RopeStyle {
    /// The two channels of a head that rotary pair `i` turns (`half` = head_dim / 2).
    #[inline(always)]
    pub fn pair(self, i: usize, half: usize) -> (usize, usize) {
        match self {
            RopeStyle::AdjacentPairs => (2 * i, 2 * i + 1),
            RopeStyle::HalfSplit => (i, i + half),
        }
    }
}

/// Model hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hyper {
    pub arch: Arch,
    pub n_layers: usize,
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Training context length (GGUF `{arch}.context_length`, llama2.c `seq_len`).
    pub ctx_train: usize,
    pub rope_base: f32,
    pub norm_eps: f32,
    pub rope_style: RopeStyle,
    /// The output projection is the token embedding (no `output.weight`).
    pub tied_output: bool,
    /// `attn_q/k/v.bias` tensors exist (qwen2).
    pub qkv_bias: bool,
}

impl Hyper {
    /// Qwen2.5-1.5B's shape (the GPU benchmarks' 1.5B shape), for tests of what the engines
    /// derive from a shape (the CUDA backend's: its tests are its users).
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn qwen2_1_5b() -> Hyper {
        Hyper {
            arch: Arch::Qwen2,
            n_layers: 28,
            dim: 1536,
            hidden_dim: 8960,
            n_heads: 12,
            n_kv_heads: 2,
            head_dim: 128,
            vocab_size: 151936,
            ctx_train: 32768,
            rope_base: 1e6,
            norm_eps: 1e-6,
            rope_style: RopeStyle::HalfSplit,
            tied_output: true,
            qkv_bias: true,
        }
    }
}

/// A tensor's type, shape and bytes. Shapes are in ggml order: `cols` is the row length (ne0),
/// `rows` the number of rows (product of the remaining dims; 1 for vectors).
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub ty: GgmlType,
    pub cols: usize,
    pub rows: usize,
    pub data: &'a [u8],
}

/// An open model file of either format.
#[derive(Debug)]
pub enum ModelFile {
    Gguf(gguf::Gguf),
    Llama2c(llama2c::Llama2c),
}

impl ModelFile {
    /// Opens `path`: GGUF when it starts with the "GGUF" magic, otherwise a llama2.c checkpoint.
    pub fn open(path: &Path) -> Result<ModelFile, FormatError> {
        let io = |err| FormatError::Io {
            path: path.to_path_buf(),
            err,
        };
        let mut magic = [0u8; 4];
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut n = 0;
        while n < 4 {
            match f.read(&mut magic[n..]).map_err(io)? {
                0 => break,
                k => n += k,
            }
        }
        if n == 4 && &magic == b"GGUF" {
            Ok(ModelFile::Gguf(gguf::Gguf::open(path)?))
        } else {
            llama2c::Llama2c::open(path)
                .map(ModelFile::Llama2c)
                .map_err(|e| neither(&magic[..n], e))
        }
    }

    /// [`ModelFile::open`] for an image in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<ModelFile, FormatError> {
        if bytes.starts_with(b"GGUF") {
            Ok(ModelFile::Gguf(gguf::Gguf::from_bytes(bytes)?))
        } else {
            let head: [u8; 4] = std::array::from_fn(|i| bytes.get(i).copied().unwrap_or(0));
            let n = bytes.len().min(4);
            llama2c::Llama2c::from_bytes(bytes)
                .map(ModelFile::Llama2c)
                .map_err(|e| neither(&head[..n], e))
        }
    }

    /// Hyperparameters, from GGUF metadata or the llama2.c header.
    pub fn hyper(&self) -> Result<Hyper, FormatError> {
        match self {
            ModelFile::Gguf(g) => gguf_hyper(g),
            ModelFile::Llama2c(m) => {
                let c = &m.config;
                Ok(Hyper {
                    arch: Arch::Llama,
                    n_layers: c.n_layers,
                    dim: c.dim,
                    hidden_dim: c.hidden_dim,
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_size(),
                    vocab_size: c.vocab_size,
                    ctx_train: c.seq_len,
                    rope_base: 10000.0,
                    norm_eps: 1e-5,
                    rope_style: RopeStyle::AdjacentPairs,
                    tied_output: c.shared_classifier,
                    qkv_bias: false,
                })
            }
        }
    }

    /// A tensor by GGUF name (`token_embd.weight`, `blk.{i}.attn_q.weight`, ...).
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, FormatError> {
        let missing = || FormatError::MissingTensor {
            name: name.to_string(),
        };
        match self {
            ModelFile::Gguf(g) => {
                let t = g.tensor(name).ok_or_else(missing)?;
                Ok(TensorRef {
                    ty: t.ty,
                    cols: t.dims[0],
                    rows: t.dims[1..].iter().product(),
                    data: g.tensor_data(t),
                })
            }
            ModelFile::Llama2c(m) => {
                let t = m.tensor(name).ok_or_else(missing)?;
                Ok(TensorRef {
                    ty: GgmlType::F32,
                    cols: t.cols,
                    rows: t.rows,
                    data: m.tensor_data(t),
                })
            }
        }
    }

    /// Whether a tensor of that name exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        match self {
            ModelFile::Gguf(g) => g.tensor(name).is_some(),
            ModelFile::Llama2c(m) => m.tensor(name).is_some(),
        }
    }

    /// The GGUF metadata, when the file is GGUF (tokenizer, chat template).
    pub fn gguf(&self) -> Option<&gguf::Gguf> {
        match self {
            ModelFile::Gguf(g) => Some(g),
            ModelFile::Llama2c(_) => None,
        }
    }

    /// Every tensor the engine uses for `h`, with its expected (cols, rows).
    pub fn expected_tensors(h: &Hyper) -> Vec<(String, usize, usize)> {
        let (d, q, kv, f) = (
            h.dim,
            h.n_heads * h.head_dim,
            h.n_kv_heads * h.head_dim,
            h.hidden_dim,
        );
        let mut v = vec![
            ("token_embd.weight".to_string(), d, h.vocab_size),
            ("output_norm.weight".into(), d, 1),
        ];
        if !h.tied_output {
            v.push(("output.weight".into(), d, h.vocab_size));
        }
        for i in 0..h.n_layers {
            let b = |s: &str| format!("blk.{i}.{s}");
            v.push((b("attn_norm.weight"), d, 1));
            v.push((b("attn_q.weight"), d, q));
            v.push((b("attn_k.weight"), d, kv));
            v.push((b("attn_v.weight"), d, kv));
            v.push((b("attn_output.weight"), q, d));
            if h.qkv_bias {
                v.push((b("attn_q.bias"), q, 1));
                v.push((b("attn_k.bias"), kv, 1));
                v.push((b("attn_v.bias"), kv, 1));
            }
            v.push((b("ffn_norm.weight"), d, 1));
            v.push((b("ffn_gate.weight"), d, f));
            v.push((b("ffn_up.weight"), d, f));
            v.push((b("ffn_down.weight"), f, d));
        }
        v
    }

    /// Checks that every tensor the engine uses exists with the shape `h` implies.
    pub fn validate(&self, h: &Hyper) -> Result<(), FormatError> {
        self.validate_some(h, true)
    }

    /// [`validate`](Self::validate) for a flash image's dense part: every tensor but the
    /// FFN's gate, up and down.
    pub fn validate_dense(&self, h: &Hyper) -> Result<(), FormatError> {
        self.validate_some(h, false)
    }

    fn validate_some(&self, h: &Hyper, ffn: bool) -> Result<(), FormatError> {
        let is_ffn = |n: &str| {
            n.ends_with(".ffn_gate.weight")
                || n.ends_with(".ffn_up.weight")
                || n.ends_with(".ffn_down.weight")
        };
        for (name, cols, rows) in Self::expected_tensors(h) {
            if !ffn && is_ffn(&name) {
                continue;
            }
            let t = self.tensor(&name)?;
            if (t.cols, t.rows) != (cols, rows) {
                return Err(FormatError::Shape {
                    name,
                    expected: (cols, rows),
                    found: (t.cols, t.rows),
                });
            }
        }
        Ok(())
    }
}

fn gguf_hyper(g: &gguf::Gguf) -> Result<Hyper, FormatError> {
    let key_err = |key: &str, msg: &str| FormatError::Key {
        key: key.to_string(),
        msg: msg.to_string(),
    };
    let arch_name = g
        .architecture()
        .ok_or_else(|| key_err("general.architecture", "missing or not a string"))?;
    let arch = match arch_name {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        other => {
            return Err(FormatError::UnknownArch {
                arch: other.to_string(),
            })
        }
    };
    let a = arch.name();
    let opt_usize = |k: &str| -> Result<Option<usize>, FormatError> {
        let key = format!("{a}.{k}");
        match g.get(&key) {
            None => Ok(None),
            Some(_) => match g.get_u32(&key) {
                Some(v) if v > 0 => Ok(Some(v as usize)),
                _ => Err(key_err(
                    &key,
                    &format!("must be a positive integer, found {:?}", g.get(&key)),
                )),
            },
        }
    };
    let req_usize = |k: &str| opt_usize(k)?.ok_or_else(|| key_err(&format!("{a}.{k}"), "missing"));
    let opt_f32 = |k: &str| -> Result<Option<f32>, FormatError> {
        let key = format!("{a}.{k}");
        match g.get(&key) {
            None => Ok(None),
            Some(_) => match g.get_f32(&key) {
                Some(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
                _ => Err(key_err(
                    &key,
                    &format!("must be a positive float, found {:?}", g.get(&key)),
                )),
            },
        }
    };

    let n_layers = req_usize("block_count")?;
    // Every layer has at least 6 tensors (9 with its FFN; a flash image's dense part has
    // none); this also bounds what `validate` enumerates.
    if n_layers > g.tensors.len() / 6 {
        return Err(key_err(
            &format!("{a}.block_count"),
            &format!(
                "is {n_layers}, but the file has only {} tensors",
                g.tensors.len()
            ),
        ));
    }
    let dim = req_usize("embedding_length")?;
    let hidden_dim = req_usize("feed_forward_length")?;
    let n_heads = req_usize("attention.head_count")?;
    let n_kv_heads = opt_usize("attention.head_count_kv")?.unwrap_or(n_heads);
    let ctx_train = req_usize("context_length")?;
    let rope_base = opt_f32("rope.freq_base")?.unwrap_or(10000.0);
    let norm_eps = opt_f32("attention.layer_norm_rms_epsilon")?
        .ok_or_else(|| key_err(&format!("{a}.attention.layer_norm_rms_epsilon"), "missing"))?;
    let head_dim = match opt_usize("attention.key_length")? {
        Some(k) => k,
        None if dim % n_heads == 0 => dim / n_heads,
        None => {
            return Err(FormatError::Model {
                msg: format!("embedding_length {dim} is not a multiple of head_count {n_heads}"),
            })
        }
    };
    if n_kv_heads > n_heads || n_heads % n_kv_heads != 0 {
        return Err(FormatError::Model {
            msg: format!("head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}"),
        });
    }
    if head_dim % 2 != 0 {
        return Err(FormatError::Model {
            msg: format!("head dimension {head_dim} is odd (RoPE needs pairs)"),
        });
    }
    let emb = g
        .tensor("token_embd.weight")
        .ok_or(FormatError::MissingTensor {
            name: "token_embd.weight".into(),
        })?;
    let vocab_size = match emb.dims[..] {
        [_, v] if v > 0 => v,
        _ => {
            return Err(FormatError::Tensor {
                name: emb.name.clone(),
                msg: format!("expected 2 dims (embedding, vocab), found {:?}", emb.dims),
            })
        }
    };
    Ok(Hyper {
        arch,
        n_layers,
        dim,
        hidden_dim,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size,
        ctx_train,
        rope_base,
        norm_eps,
        rope_style: match arch {
            Arch::Llama => RopeStyle::AdjacentPairs,
            Arch::Qwen2 => RopeStyle::HalfSplit,
        },
        tied_output: g.tensor("output.weight").is_none(),
        qkv_bias: g.tensor("blk.0.attn_q.bias").is_some(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::gguf::build::Builder;
    use super::*;

    /// A one-layer model of width 8 and 12 FFN neurons, all weights zero (other modules' tests
    /// open it with `ModelFile::from_bytes(tiny(..).build())`).
    pub(crate) fn tiny(arch: &str, bias: bool, tied: bool) -> Builder {
        let (d, f, v, nh, nkv) = (8u64, 12u64, 5u64, 2u32, 1u32);
        let kv = d / nh as u64 * nkv as u64;
        let mut b = Builder::default();
        b.kv_str("general.architecture", arch)
            .kv_u32(&format!("{arch}.block_count"), 1)
            .kv_u32(&format!("{arch}.embedding_length"), d as u32)
            .kv_u32(&format!("{arch}.feed_forward_length"), f as u32)
            .kv_u32(&format!("{arch}.attention.head_count"), nh)
            .kv_u32(&format!("{arch}.attention.head_count_kv"), nkv)
            .kv_u32(&format!("{arch}.context_length"), 64)
            .kv_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6);
        let z = |n: u64| vec![0.0f32; n as usize];
        b.tensor_f32("token_embd.weight", &[d, v], &z(d * v));
        b.tensor_f32("output_norm.weight", &[d], &z(d));
        if !tied {
            b.tensor_f32("output.weight", &[d, v], &z(d * v));
        }
        b.tensor_f32("blk.0.attn_norm.weight", &[d], &z(d));
        b.tensor_f32("blk.0.attn_q.weight", &[d, d], &z(d * d));
        b.tensor_f32("blk.0.attn_k.weight", &[d, kv], &z(d * kv));
        b.tensor_f32("blk.0.attn_v.weight", &[d, kv], &z(d * kv));
        b.tensor_f32("blk.0.attn_output.weight", &[d, d], &z(d * d));
        if bias {
            b.tensor_f32("blk.0.attn_q.bias", &[d], &z(d));
            b.tensor_f32("blk.0.attn_k.bias", &[kv], &z(kv));
            b.tensor_f32("blk.0.attn_v.bias", &[kv], &z(kv));
        }
        b.tensor_f32("blk.0.ffn_norm.weight", &[d], &z(d));
        b.tensor_f32("blk.0.ffn_gate.weight", &[d, f], &z(d * f));
        b.tensor_f32("blk.0.ffn_up.weight", &[d, f], &z(d * f));
        b.tensor_f32("blk.0.ffn_down.weight", &[f, d], &z(f * d));
        b
    }

    #[test]
    fn gguf_hyper_llama_and_qwen2() {
        let m = ModelFile::from_bytes(tiny("llama", false, true).build()).unwrap();
        let h = m.hyper().unwrap();
        assert_eq!(h.arch, Arch::Llama);
        assert_eq!(
            (
                h.n_layers,
                h.dim,
                h.hidden_dim,
                h.n_heads,
                h.n_kv_heads,
                h.head_dim
            ),
            (1, 8, 12, 2, 1, 4)
        );
        assert_eq!((h.vocab_size, h.ctx_train), (5, 64));
        assert_eq!(h.rope_base, 10000.0);
        assert_eq!(h.norm_eps, 1e-6);
        assert_eq!(h.rope_style, RopeStyle::AdjacentPairs);
        assert!(h.tied_output && !h.qkv_bias);
        m.validate(&h).unwrap();

        let m = ModelFile::from_bytes(tiny("qwen2", true, false).build()).unwrap();
        let h = m.hyper().unwrap();
        assert_eq!(h.arch, Arch::Qwen2);
        assert_eq!(h.rope_style, RopeStyle::HalfSplit);
        assert!(!h.tied_output && h.qkv_bias);
        m.validate(&h).unwrap();
        let t = m.tensor("blk.0.attn_k.bias").unwrap();
        assert_eq!((t.cols, t.rows, t.data.len()), (4, 1, 16));
    }

    #[test]
    fn gguf_hyper_errors() {
        let e = ModelFile::from_bytes(tiny("gpt2", false, true).build())
            .unwrap()
            .hyper()
            .unwrap_err();
        assert!(e.to_string().contains("'gpt2'"), "{e}");

        let mut b = tiny("llama", false, true);
        b.kv.retain(|(k, _, _)| k != "llama.block_count");
        let e = ModelFile::from_bytes(b.build())
            .unwrap()
            .hyper()
            .unwrap_err();
        assert!(e.to_string().contains("llama.block_count"), "{e}");

        let mut b = tiny("llama", false, true);
        b.kv.retain(|(k, _, _)| k != "llama.block_count");
        b.kv_u32("llama.block_count", u32::MAX);
        let e = ModelFile::from_bytes(b.build())
            .unwrap()
            .hyper()
            .unwrap_err();
        assert!(e.to_string().contains("only 11 tensors"), "{e}");

        let mut b = tiny("llama", false, true);
        b.kv_str("llama.rope.freq_base", "x");
        let e = ModelFile::from_bytes(b.build())
            .unwrap()
            .hyper()
            .unwrap_err();
        assert!(e.to_string().contains("llama.rope.freq_base"), "{e}");

        let mut b = tiny("llama", false, true);
        b.tensors.retain(|t| t.0 != "blk.0.ffn_up.weight");
        let m = ModelFile::from_bytes(b.build()).unwrap();
        let e = m.validate(&m.hyper().unwrap()).unwrap_err();
        assert!(e.to_string().contains("blk.0.ffn_up.weight"), "{e}");
        assert!(m.tensor("nope").unwrap_err().to_string().contains("'nope'"));

        let mut b = tiny("llama", false, true);
        for t in b
            .tensors
            .iter_mut()
            .filter(|t| t.0 == "blk.0.ffn_down.weight")
        {
            t.1 = vec![8, 12];
        }
        let m = ModelFile::from_bytes(b.build()).unwrap();
        let e = m.validate(&m.hyper().unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("blk.0.ffn_down.weight") && e.contains("expected (cols 12, rows 8)"),
            "{e}"
        );
    }

    #[test]
    fn text_is_neither_gguf_nor_llama2c() {
        let e =
            ModelFile::from_bytes(b"# LeanStream\n\nA fixed-memory LLM inference daemon.".to_vec())
                .unwrap_err()
                .to_string();
        assert!(
            e.starts_with("neither a GGUF file (it starts with bytes [23 20 4c 65] \"# Le\"")
                && e.contains("nor a llama2.c checkpoint (dim 1699487779 is not a multiple"),
            "{e}"
        );
        // Shorter than a header: said too.
        let e = ModelFile::from_bytes(b"hi".to_vec())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[68 69] \"hi\"") && e.contains("llama2.c header"),
            "{e}"
        );
    }

    #[test]
    fn llama2c_view() {
        let m =
            ModelFile::from_bytes(llama2c::build([8, 12, 2, 2, 1, 10, 4], |i| i as f32)).unwrap();
        let h = m.hyper().unwrap();
        assert_eq!(
            (
                h.dim,
                h.hidden_dim,
                h.n_layers,
                h.n_heads,
                h.n_kv_heads,
                h.head_dim
            ),
            (8, 12, 2, 2, 1, 4)
        );
        assert_eq!((h.vocab_size, h.ctx_train, h.tied_output), (10, 4, true));
        assert_eq!(
            (h.norm_eps, h.rope_base, h.rope_style),
            (1e-5, 10000.0, RopeStyle::AdjacentPairs)
        );
        m.validate(&h).unwrap();
        let t = m.tensor("blk.1.ffn_down.weight").unwrap();
        assert_eq!(
            (t.ty, t.cols, t.rows, t.data.len()),
            (GgmlType::F32, 12, 8, 12 * 8 * 4)
        );
    }
}
