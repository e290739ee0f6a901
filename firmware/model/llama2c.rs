//! llama2.c legacy checkpoints (`run.c`'s format, "version 0").
//!
//! A header of 7 little-endian i32 (`dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//! vocab_size, seq_len`; a negative `vocab_size` means the classifier is not shared with the
//! token embedding), then f32 tensors in this order, each stacked over layers:
//! `token_embedding_table [vocab][dim]`, `rms_att_weight [L][dim]`, `wq [L][dim][dim]`,
//! `wk [L][kv_dim][dim]`, `wv [L][kv_dim][dim]`, `wo [L][dim][dim]`, `rms_ffn_weight [L][dim]`,
//! `w1 [L][hidden][dim]`, `w2 [L][dim][hidden]`, `w3 [L][hidden][dim]`, `rms_final_weight [dim]`,
//! `freq_cis_real [seq_len][head_size/2]`, `freq_cis_imag` (same; unused, skipped), and
//! `wcls [vocab][dim]` when unshared. The file must have exactly this size.
//!
//! Tensors are exposed under the GGUF names (`token_embd.weight`, `blk.{i}.attn_q.weight`, ...)
//! with `cols` = the row length (ne0) and `rows` = the number of rows, like GGUF.

use super::gguf::FormatError;
use std::collections::HashMap;
use std::path::Path;

/// Header size in bytes.
pub const HEADER_BYTES: usize = 7 * 4;

/// The checkpoint header, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab_size: usize,
    pub seq_len: usize,
    /// The classifier is the token embedding (header vocab_size was positive).
    pub shared_classifier: bool,
}

impl Config {
    pub fn head_size(&self) -> usize {
        self.dim / self.n_heads
    }

    pub fn kv_dim(&self) -> usize {
        self.head_size() * self.n_kv_heads
    }
}

/// One f32 tensor of the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    /// Row length (ne0).
    pub cols: usize,
    /// Number of rows (1 for vectors).
    pub rows: usize,
    /// Absolute byte offset in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A memory-mapped llama2.c checkpoint.
pub struct Llama2c {
    backing: Backing,
    pub config: Config,
    pub tensors: Vec<Tensor>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for Llama2c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama2c")
            .field("config", &self.config)
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

fn model_err(msg: String) -> FormatError {
    FormatError::Model {
        msg: format!("llama2.c checkpoint: {msg}"),
    }
}

/// Parses and checks the header against the file length; returns the config and the tensors.
fn parse(buf: &[u8]) -> Result<(Config, Vec<Tensor>), FormatError> {
    if buf.len() < HEADER_BYTES {
        return Err(FormatError::Truncated {
            offset: 0,
            what: "llama2.c header (7 x i32)".into(),
            need: HEADER_BYTES,
            have: buf.len(),
        });
    }
    let field =
        |i: usize| i32::from_le_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]]);
    const NAMES: [&str; 7] = [
        "dim",
        "hidden_dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "vocab_size",
        "seq_len",
    ];
    let mut h = [0usize; 7];
    for (i, v) in h.iter_mut().enumerate() {
        let raw = field(i);
        let x = if i == 5 {
            raw.unsigned_abs() as i64
        } else {
            raw as i64
        };
        if x <= 0 {
            return Err(model_err(format!(
                "header field {} is {raw}, must be positive",
                NAMES[i]
            )));
        }
        *v = x as usize;
    }
    let shared = field(5) > 0;
    let c = Config {
        dim: h[0],
        hidden_dim: h[1],
        n_layers: h[2],
        n_heads: h[3],
        n_kv_heads: h[4],
        vocab_size: h[5],
        seq_len: h[6],
        shared_classifier: shared,
    };
    if !c.dim.is_multiple_of(c.n_heads) {
        return Err(model_err(format!(
            "dim {} is not a multiple of n_heads {}",
            c.dim, c.n_heads
        )));
    }
    if c.n_kv_heads > c.n_heads || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(model_err(format!(
            "n_heads {} is not a multiple of n_kv_heads {}",
            c.n_heads, c.n_kv_heads
        )));
    }
    if !c.head_size().is_multiple_of(2) {
        return Err(model_err(format!("head size {} is odd", c.head_size())));
    }

    let (l, d, hd, kv) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim());
    let too_big = || {
        model_err(format!(
            "header {c:?} describes more data than fits in memory"
        ))
    };
    let mul = |a: usize, b: usize| a.checked_mul(b);
    // (name, cols, rows, layers); layers = 0 means a single unstacked tensor.
    let mut layout: Vec<(&str, usize, usize, usize)> = vec![
        ("token_embd.weight", d, c.vocab_size, 0),
        ("attn_norm.weight", d, 1, l),
        ("attn_q.weight", d, d, l),
        ("attn_k.weight", d, kv, l),
        ("attn_v.weight", d, kv, l),
        ("attn_output.weight", d, d, l),
        ("ffn_norm.weight", d, 1, l),
        ("ffn_gate.weight", d, hd, l), // w1
        ("ffn_down.weight", hd, d, l), // w2
        ("ffn_up.weight", d, hd, l),   // w3
        ("output_norm.weight", d, 1, 0),
        (
            "(freq_cis_real, freq_cis_imag)",
            c.head_size() / 2,
            c.seq_len,
            2,
        ),
    ];
    if !shared {
        layout.push(("output.weight", d, c.vocab_size, 0));
    }
    // First the sizes (checked arithmetic) and the file size check, so that a hostile header
    // allocates nothing; then the tensor list.
    let mut starts = Vec::with_capacity(layout.len());
    let mut off = HEADER_BYTES;
    for &(_, cols, rows, layers) in &layout {
        let one = mul(cols, rows)
            .and_then(|n| mul(n, 4))
            .ok_or_else(too_big)?;
        let total = mul(one, layers.max(1)).ok_or_else(too_big)?;
        starts.push((off, one));
        off = off.checked_add(total).ok_or_else(too_big)?;
    }
    if buf.len() != off {
        let what = if buf.len() < off {
            "truncated"
        } else {
            "too long"
        };
        return Err(model_err(format!(
            "file is {what}: {} bytes, but the header (dim {}, hidden {}, layers {}, heads {}, kv heads {}, \
             vocab {}{}, seq_len {}) needs exactly {off}",
            buf.len(),
            c.dim,
            c.hidden_dim,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.vocab_size,
            if shared { " shared" } else { " unshared" },
            c.seq_len
        )));
    }
    let mut tensors = Vec::new();
    for ((name, cols, rows, layers), (start, one)) in layout.into_iter().zip(starts) {
        if name.starts_with('(') {
            continue;
        }
        for i in 0..layers.max(1) {
            let name = if layers == 0 {
                name.to_string()
            } else {
                format!("blk.{i}.{name}")
            };
            tensors.push(Tensor {
                name,
                cols,
                rows,
                offset: start + i * one,
                n_bytes: one,
            });
        }
    }
    Ok((c, tensors))
}

impl Llama2c {
    /// Memory-maps and validates a checkpoint.
    pub fn open(path: &Path) -> Result<Llama2c, FormatError> {
        let io = |err| FormatError::Io {
            path: path.to_path_buf(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.len() < HEADER_BYTES as u64 {
            let have = file.metadata().map_err(io)?.len() as usize;
            return Err(FormatError::Truncated {
                offset: 0,
                what: "llama2.c header (7 x i32)".into(),
                need: HEADER_BYTES,
                have,
            });
        }
        // SAFETY: read-only map; model files are not modified while open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let (config, tensors) = parse(&map)?;
        Ok(Self::assemble(Backing::Mmap(map), config, tensors))
    }

    /// Parses a checkpoint held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Llama2c, FormatError> {
        let (config, tensors) = parse(&bytes)?;
        Ok(Self::assemble(Backing::Owned(bytes), config, tensors))
    }

    fn assemble(backing: Backing, config: Config, tensors: Vec<Tensor>) -> Llama2c {
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Llama2c {
            backing,
            config,
            tensors,
            index,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }

    /// A tensor by its GGUF name.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's f32 bytes (little-endian); empty for a tensor not of this file.
    pub fn tensor_data(&self, t: &Tensor) -> &[u8] {
        t.offset
            .checked_add(t.n_bytes)
            .and_then(|end| self.bytes().get(t.offset..end))
            .unwrap_or(&[])
    }
}

/// Builds a checkpoint image (tests): the header and `fill(i)` for the i-th f32.
#[doc(hidden)]
pub fn build(header: [i32; 7], fill: impl Fn(usize) -> f32) -> Vec<u8> {
    let [d, hd, l, nh, nkv, v, s] = header.map(|x| x.unsigned_abs() as usize);
    let kv = d / nh * nkv;
    let mut n = v * d + l * (2 * d + 2 * d * d + 2 * kv * d + 3 * d * hd) + d + s * (d / nh);
    if header[5] < 0 {
        n += v * d;
    }
    let mut out: Vec<u8> = header.iter().flat_map(|x| x.to_le_bytes()).collect();
    out.extend((0..n).flat_map(|i| fill(i).to_le_bytes()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: [i32; 7] = [8, 12, 2, 2, 1, 10, 4];

    fn f32_at(b: &[u8], i: usize) -> f32 {
        f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
    }

    #[test]
    fn layout_of_small_checkpoint() {
        let m = Llama2c::from_bytes(build(SMALL, |i| i as f32)).unwrap();
        let c = m.config;
        assert_eq!((c.dim, c.kv_dim(), c.head_size()), (8, 4, 4));
        assert!(c.shared_classifier);
        assert!(m.tensor("output.weight").is_none());
        let emb = m.tensor("token_embd.weight").unwrap();
        assert_eq!((emb.cols, emb.rows), (8, 10));
        assert_eq!(f32_at(m.tensor_data(emb), 0), 0.0);
        // blk.1.attn_q.weight starts after emb (80), rms_att (16), wq of layer 0 (64).
        let q1 = m.tensor("blk.1.attn_q.weight").unwrap();
        assert_eq!((q1.cols, q1.rows), (8, 8));
        assert_eq!(f32_at(m.tensor_data(q1), 0), (80 + 16 + 64) as f32);
        let k0 = m.tensor("blk.0.attn_k.weight").unwrap();
        assert_eq!((k0.cols, k0.rows), (8, 4));
        let down = m.tensor("blk.1.ffn_down.weight").unwrap();
        assert_eq!((down.cols, down.rows), (12, 8));
        let norm = m.tensor("output_norm.weight").unwrap();
        assert_eq!((norm.cols, norm.rows), (8, 1));
        // output_norm comes right after w3 of the last layer.
        let up1 = m.tensor("blk.1.ffn_up.weight").unwrap();
        assert_eq!(norm.offset, up1.offset + up1.n_bytes);
        assert_eq!(m.tensors.len(), 2 + 2 * 9);
    }

    #[test]
    fn unshared_classifier() {
        let mut h = SMALL;
        h[5] = -10;
        let b = build(h, |i| i as f32);
        let m = Llama2c::from_bytes(b.clone()).unwrap();
        assert!(!m.config.shared_classifier);
        let out = m.tensor("output.weight").unwrap();
        assert_eq!((out.cols, out.rows), (8, 10));
        assert_eq!(out.offset + out.n_bytes, b.len());
    }

    fn err(b: Vec<u8>) -> String {
        match Llama2c::from_bytes(b) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn wrong_sizes() {
        let b = build(SMALL, |_| 0.0);
        assert!(err(b[..b.len() - 4].to_vec()).contains("truncated"));
        let mut long = b.clone();
        long.push(0);
        assert!(err(long).contains("too long"));
        assert!(err(b[..10].to_vec()).contains("header"));
        for n in 0..b.len() {
            assert!(Llama2c::from_bytes(b[..n].to_vec()).is_err());
        }
    }

    #[test]
    fn bad_headers() {
        let with = |i: usize, v: i32| {
            let mut h = SMALL;
            h[i] = v;
            let mut b = build(SMALL, |_| 0.0);
            b[..28].copy_from_slice(&h.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>());
            err(b)
        };
        assert!(with(0, 0).contains("dim is 0"));
        assert!(with(3, 3).contains("not a multiple of n_heads"));
        assert!(with(4, 3).contains("n_kv_heads"));
        assert!(with(2, i32::MAX).contains("truncated"));
        assert!(with(5, i32::MIN).contains("truncated"));
        assert!(with(6, -1).contains("seq_len"));
        let mut h = SMALL;
        h[0] = 6;
        h[3] = 2; // head size 3
        assert!(Llama2c::from_bytes(build(h, |_| 0.0))
            .unwrap_err()
            .to_string()
            .contains("odd"));
    }
}
