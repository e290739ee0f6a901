//! Low-bit weights (BitLLM, paper 4.3-4.4): the precisions an engine can boot in, the exact byte
//! formats of group-32 w8 and w4 matrices and the three int4 packings, conversion of any GGML
//! tensor into them (import as is where possible, else round-to-nearest requantization), and the
//! integer CPU kernels (`cpu`).
//!
//! # Byte formats (shared with the CUDA dp4a kernels: same bytes, little-endian)
//!
//! A matrix has `rows` rows of `cols` values, `cols` a multiple of 32; row `r`, group `g` holds
//! values `32g .. 32g+32` of the row. `ng = cols / 32` groups per row. `d` is an IEEE fp16 scale.
//!
//! **w8** (= GGML `Q8_0`, imported byte for byte): group `(r, g)` is the 34-byte block at
//! `(r * ng + g) * 34`: `d` (2 bytes), then `q[0..32]` as int8. Value `i` = `d * q[i]`.
//!
//! **w4** (the values of GGML `Q4_0`): every group is `d` plus 32 unsigned nibbles `q[i]` in
//! 0..16; value `i` = `d * (q[i] - 8)`. Always 18 bytes per group (`row_bytes = 18 * ng`); the
//! packing says where the 16 quant bytes and the scale sit:
//!
//! - `contiguous`: group `(r, g)` at `(r * ng + g) * 18`: `d`, then byte `j` (0..16) =
//!   `q[2j] | q[2j+1] << 4`. Densest to read, most work to unpack (a shift and a mask per value).
//! - `interleaved` (lane-interleaved, paper figure 8b): same 18-byte blocks; the 16 quant bytes
//!   are four little-endian u32 words `W[k]` (k = 0..4) whose byte `b` (0..4) is
//!   `q[8k+b] | q[8k+4+b] << 4`. So `W & 0x0F0F0F0F` holds `q[8k..8k+4]` and
//!   `(W >> 4) & 0x0F0F0F0F` holds `q[8k+4..8k+8]`, each byte in its dp4a lane: one shift and two
//!   masks per word give eight dp4a-ready bytes, for activation bytes `8k..8k+8` as they lie.
//! - `swizzled` (block-swizzled, figure 8c, for 128-byte coalesced warp loads): rows go in bands
//!   of 32 (the last band padded with zero groups to 32 rows); band `B = r / 32`, lane
//!   `L = r % 32`. Band `B`, group column `g` is one 576-byte tile at `(B * ng + g) * 576`:
//!   the 32 scales first (`d` of lane `L` at `2L`, 64 bytes), then the quant words word-major:
//!   word `k` (0..4, laid out as in `interleaved`) of lane `L` at `64 + 128k + 4L`. One warp load
//!   `k` (lane `L` reads 4 bytes at `64 + 128k + 4L`) is one 128-byte line. A band is exactly
//!   `32 * row_bytes` bytes, so bands sit where 32 rows of the other packings would. The same
//!   property serves the CPU: one 32-byte load is word `k` of eight rows, a 32-bit lane each,
//!   so the x86 kernels take eight rows' group dots at once with no horizontal add, about
//!   twice the speed of the others (`backend::cpu::lowbit::x86::chunk_swizzled`). That makes it the default.
//!
//! All three packings hold the same values; the kernels unpack each group to the same 32 int8
//! weights (`q - 8`), take the same exact int32 dot with the int8 activations, and scale it in
//! the same f32 epilogue, so a matrix-vector product is bit-identical across packings.
//!
//! **Activations** are quantized per token and group of 32 on the fly, as ggml's Q8_1 does:
//! `d = amax / 127` (f32), `q = round(x / d)` (half away from zero) in -127..=127.
//!
//! # Precisions
//!
//! `native` (the default) runs every tensor in the type the file stores, with an f16 KV cache;
//! its Q8_0 and Q4_0 matrices are imported as they are into w8 and w4 (the same values) and so
//! run the integer kernels below, every other type the classic ones. `f16` converts every
//! matrix to F16 (f32 activations, f16 KV). (`kv::kv_precision` decides the cache.)
//! `w8a8` converts every matrix to w8 and keeps the KV cache in int8. `w4a8` puts the FFN's gate
//! and up and attention's output in w4 (the chosen packing), and attention's q, k, v, the FFN's
//! down projection, every matrix of the first and last layer, and the token embeddings / output
//! head in w8 (as llama.cpp's 4-bit files keep their output head and, in the mixed ones,
//! ffn_down, attn_v and the end layers at more bits; see `Role::Sensitive`), with int8 KV. A matrix whose rows are not whole groups of 32 stays in its
//! own type (said in the conversion report).

pub mod view;

use crate::model::ggml::{dequantize_row, f16_to_f32, f32_to_f16, quantize_row_q8_0, GgmlType};
use crate::model::TensorRef;
use std::fmt;

/// Values per quantization group.
pub const GROUP: usize = 32;
/// Bytes of one w8 group (fp16 scale + 32 int8).
pub const W8_GROUP_BYTES: usize = 34;
/// Bytes of one w4 group (fp16 scale + 16 bytes of nibbles), in every packing.
pub const W4_GROUP_BYTES: usize = 18;
/// Rows per band in the swizzled packing.
pub const SWIZZLE_ROWS: usize = 32;
/// Bytes of one swizzled tile (32 rows x one group).
pub const SWIZZLE_TILE_BYTES: usize = SWIZZLE_ROWS * W4_GROUP_BYTES;

/// A precision or packing name this build does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    UnknownPrecision(String),
    UnknownPacking(String),
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::UnknownPrecision(s) => write!(
                f,
                "unknown precision '{s}' (expected native, f16, w8a8 or w4a8)"
            ),
            QuantError::UnknownPacking(s) => write!(
                f,
                "unknown packing '{s}' (expected contiguous, interleaved, swizzled or auto)"
            ),
        }
    }
}

impl std::error::Error for QuantError {}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<QuantError> for String {
    fn from(e: QuantError) -> String {
        e.to_string()
    }
}

/// The precision an engine runs in (`--precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// The file's own tensor types, f16 KV cache.
    #[default]
    Native,
    F16,
    W8a8,
    W4a8,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::Native,
        Precision::F16,
        Precision::W8a8,
        Precision::W4a8,
    ];

    pub fn parse(s: &str) -> Result<Precision, QuantError> {
        Ok(match s {
            "native" => Precision::Native,
            "f16" => Precision::F16,
            "w8a8" => Precision::W8a8,
            "w4a8" => Precision::W4a8,
            _ => return Err(QuantError::UnknownPrecision(s.into())),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Native => "native",
            Precision::F16 => "f16",
            Precision::W8a8 => "w8a8",
            Precision::W4a8 => "w4a8",
        }
    }

    /// Whether the KV cache is int8.
    pub fn int8_kv(self) -> bool {
        matches!(self, Precision::W8a8 | Precision::W4a8)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the nibbles of a w4 group sit (see the module docs). The default is swizzled: its
/// tiles put word k of 32 rows side by side, which the x86 kernels read eight rows per
/// register (`backend::cpu::lowbit::x86::chunk_swizzled`), about twice as fast as the other packings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Packing {
    Contiguous,
    Interleaved,
    #[default]
    Swizzled,
}

impl Packing {
    pub const ALL: [Packing; 3] = [Packing::Contiguous, Packing::Interleaved, Packing::Swizzled];

    pub fn parse(s: &str) -> Result<Packing, QuantError> {
        Ok(match s {
            "contiguous" => Packing::Contiguous,
            "interleaved" => Packing::Interleaved,
            "swizzled" => Packing::Swizzled,
            _ => return Err(QuantError::UnknownPacking(s.into())),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Packing::Contiguous => "contiguous",
            Packing::Interleaved => "interleaved",
            Packing::Swizzled => "swizzled",
        }
    }
}

/// A matrix in one of this module's formats (a [`crate::backend::cpu::Matrix`] with `q` set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QFormat {
    W8,
    W4(Packing),
}

impl QFormat {
    /// The GGML type with the same values (and, for w8, the same bytes).
    pub fn ggml_type(self) -> GgmlType {
        match self {
            QFormat::W8 => GgmlType::Q8_0,
            QFormat::W4(_) => GgmlType::Q4_0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QFormat::W8 => "w8",
            QFormat::W4(Packing::Contiguous) => "w4/contiguous",
            QFormat::W4(Packing::Interleaved) => "w4/interleaved",
            QFormat::W4(Packing::Swizzled) => "w4/swizzled",
        }
    }

    /// Bytes a `rows` x `cols` matrix takes (cols a multiple of 32).
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> usize {
        let ng = cols / GROUP;
        match self {
            QFormat::W8 => rows * ng * W8_GROUP_BYTES,
            QFormat::W4(Packing::Swizzled) => {
                rows.next_multiple_of(SWIZZLE_ROWS) * ng * W4_GROUP_BYTES
            }
            QFormat::W4(_) => rows * ng * W4_GROUP_BYTES,
        }
    }
}

/// What a tensor becomes at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Its own type, bytes as stored.
    Keep,
    F16,
    Q(QFormat),
}

/// Which matrices of a model a [`Target`] is chosen for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Token embeddings and the output head.
    EmbedOrOutput,
    /// Attention and FFN projections.
    Block,
    /// The matrices 4-bit weights hurt most, kept in w8 at `w4a8`: the FFN's down projection (its
    /// input, the SwiGLU activation, has the widest range; llama.cpp's mixed 4-bit files keep it
    /// at 6 bits), attention's q, k and v (small: with grouped-query attention k and v are a
    /// fraction of q, and together they are a fifth of a layer's bytes), and every matrix of the
    /// first and the last layer (llama.cpp's mixed files give those more bits too). Measured over
    /// WikiText-2, 8 windows (docs/LOWBIT.md): SmolLM2-135M +24.2% over f16 with every block
    /// matrix in w4, +12.6% with ffn_down in w8, +8.05% with q, k, v too, +7.42% with the first
    /// and last layer too; Qwen2.5-0.5B (2 windows) +7.9%, +2.8% with q, k, v in w8. The bulk of
    /// the bytes, the FFN's gate and up and attention's output in the other layers, stay in w4.
    Sensitive,
}

impl Role {
    /// The role of a GGUF tensor, by its full name (`blk.7.ffn_up.weight`), in a model of
    /// `n_layers` layers.
    pub fn of(name: &str, n_layers: usize) -> Role {
        if name.starts_with("token_embd") || name.starts_with("output.") {
            return Role::EmbedOrOutput;
        }
        let sensitive = [
            "ffn_down.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
        ]
        .iter()
        .any(|n| name.ends_with(n));
        let edge = layer_of(name).is_some_and(|i| i == 0 || i + 1 == n_layers);
        if sensitive || edge {
            Role::Sensitive
        } else {
            Role::Block
        }
    }
}

/// The layer index of a tensor named `blk.N.…`.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The target of a matrix of type `ty` with `cols` columns in `role` at `precision`.
///
/// At `native`, Q8_0 and Q4_0 matrices are imported as they are into w8 and w4 (the same
/// values: int8 or int4 with an fp16 scale per group of 32; DESIGN.md section 8), so they run
/// the integer kernels of `cpu` rather than the classic ones; every other type keeps its own.
pub fn target(
    precision: Precision,
    packing: Packing,
    role: Role,
    ty: GgmlType,
    cols: usize,
) -> Target {
    let whole = cols.is_multiple_of(GROUP);
    match precision {
        Precision::Native if whole && ty == GgmlType::Q8_0 => Target::Q(QFormat::W8),
        Precision::Native if whole && ty == GgmlType::Q4_0 => Target::Q(QFormat::W4(packing)),
        Precision::Native => Target::Keep,
        Precision::F16 => Target::F16,
        _ if !whole => Target::Keep,
        Precision::W8a8 => Target::Q(QFormat::W8),
        Precision::W4a8 => match role {
            Role::EmbedOrOutput => Target::Q(QFormat::W8),
            Role::Sensitive => Target::Q(QFormat::W8),
            Role::Block => Target::Q(QFormat::W4(packing)),
        },
    }
}

/// Bytes `t` takes once converted to `target`.
pub fn target_bytes(target: Target, t: &TensorRef) -> usize {
    match target {
        Target::Keep => t.data.len(),
        Target::F16 => t.rows * t.cols * 2,
        Target::Q(f) => f.matrix_bytes(t.rows, t.cols),
    }
}

/// How a tensor was converted: imported as is (bytes copied or nibbles reordered, values kept),
/// or requantized (round to nearest, group 32) from another type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    AsIs,
    Requantized,
}

/// Converts `t` into `out` (`target_bytes(target, t)` bytes). `scratch` is a boot-time row
/// buffer, grown as needed.
pub fn convert(
    target: Target,
    t: &TensorRef,
    out: &mut [u8],
    scratch: &mut Vec<f32>,
) -> Conversion {
    assert_eq!(out.len(), target_bytes(target, t), "conversion output size");
    let (rows, cols) = (t.rows, t.cols);
    let src_rb = t.data.len() / rows.max(1);
    scratch.resize(cols, 0.0);
    match target {
        Target::Keep => {
            out.copy_from_slice(t.data);
            Conversion::AsIs
        }
        Target::F16 => {
            if t.ty == GgmlType::F16 {
                out.copy_from_slice(t.data);
                return Conversion::AsIs;
            }
            for r in 0..rows {
                dequantize_row(t.ty, &t.data[r * src_rb..][..src_rb], scratch);
                for (o, &v) in out[r * cols * 2..][..cols * 2]
                    .chunks_exact_mut(2)
                    .zip(scratch.iter())
                {
                    o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
                }
            }
            Conversion::Requantized
        }
        Target::Q(QFormat::W8) => {
            if t.ty == GgmlType::Q8_0 {
                out.copy_from_slice(t.data);
                return Conversion::AsIs;
            }
            let rb = QFormat::W8.matrix_bytes(1, cols);
            for r in 0..rows {
                dequantize_row(t.ty, &t.data[r * src_rb..][..src_rb], scratch);
                quantize_row_q8_0(scratch, &mut out[r * rb..][..rb]);
            }
            Conversion::Requantized
        }
        Target::Q(f @ QFormat::W4(packing)) => {
            out.fill(0);
            let ng = cols / GROUP;
            let as_is = t.ty == GgmlType::Q4_0;
            for r in 0..rows {
                let row = &t.data[r * src_rb..][..src_rb];
                if !as_is {
                    dequantize_row(t.ty, row, scratch);
                }
                for g in 0..ng {
                    let (d, q) = if as_is {
                        q4_0_group(&row[g * 18..][..18])
                    } else {
                        quantize_w4_group(&scratch[g * GROUP..][..GROUP])
                    };
                    write_w4_group(out, packing, cols, r, g, d, &q);
                }
            }
            debug_assert_eq!(out.len(), f.matrix_bytes(rows, cols));
            if as_is {
                Conversion::AsIs
            } else {
                Conversion::Requantized
            }
        }
    }
}

/// `t` converted to `tg` as plain GGML data (F16, Q8_0 or Q4_0 blocks, whatever the packing; or
/// its own bytes for `Keep`): the GGML type, its bytes, and how. The values are those of
/// [`convert`]'s; `leanstream requant` (`offline::requant`) writes them to a file, the CUDA weight image repacks them.
pub fn convert_to_ggml(
    tg: Target,
    t: &TensorRef,
    scratch: &mut Vec<f32>,
) -> (GgmlType, Vec<u8>, Conversion) {
    match tg {
        Target::Keep => (t.ty, t.data.to_vec(), Conversion::AsIs),
        Target::F16 | Target::Q(QFormat::W8) => {
            let mut out = vec![0u8; target_bytes(tg, t)];
            let how = convert(tg, t, &mut out, scratch);
            let ty = match tg {
                Target::F16 => GgmlType::F16,
                _ => GgmlType::Q8_0,
            };
            (ty, out, how)
        }
        Target::Q(QFormat::W4(_)) => {
            if t.ty == GgmlType::Q4_0 {
                return (GgmlType::Q4_0, t.data.to_vec(), Conversion::AsIs);
            }
            let ng = t.cols / GROUP;
            let src_rb = t.data.len() / t.rows.max(1);
            let mut out = vec![0u8; t.rows * ng * 18];
            scratch.resize(t.cols, 0.0);
            for r in 0..t.rows {
                dequantize_row(t.ty, &t.data[r * src_rb..][..src_rb], scratch);
                for g in 0..ng {
                    let (d, q) = quantize_w4_group(&scratch[g * GROUP..][..GROUP]);
                    out[(r * ng + g) * 18..][..18].copy_from_slice(&q4_0_block(d, &q));
                }
            }
            (GgmlType::Q4_0, out, Conversion::Requantized)
        }
    }
}

/// GGML Q4_0 block (`d`, byte j = `q[j] | q[j+16] << 4`) as (d, q in natural order).
pub fn q4_0_group(blk: &[u8]) -> (u16, [u8; GROUP]) {
    let d = u16::from_le_bytes([blk[0], blk[1]]);
    let mut q = [0u8; GROUP];
    for j in 0..16 {
        q[j] = blk[2 + j] & 0xF;
        q[j + 16] = blk[2 + j] >> 4;
    }
    (d, q)
}

/// The GGML Q4_0 block of scale `d` and nibbles `q` in natural order (the inverse of
/// [`q4_0_group`]).
pub fn q4_0_block(d: u16, q: &[u8; GROUP]) -> [u8; 18] {
    let mut blk = [0u8; 18];
    blk[..2].copy_from_slice(&d.to_le_bytes());
    for j in 0..16 {
        blk[2 + j] = q[j] | q[j + 16] << 4;
    }
    blk
}

/// Round-to-nearest int4 quantization of one group, as ggml's `quantize_row_q4_0_ref`: the
/// value of largest magnitude maps to -8, `d = max / -8`, `q = min(15, trunc(x / d + 8.5))`.
/// (A searched scale, ggml's `make_qx_quants` with or without x^2 weights, was tried and gave
/// worse perplexity on SmolLM2: 24.9 and 25.5 against 24.1 on WikiText-2 window 1.)
pub fn quantize_w4_group(x: &[f32]) -> (u16, [u8; GROUP]) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; GROUP];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = ((v * id + 8.5) as i8).min(15) as u8;
    }
    (f32_to_f16(d), q)
}

/// Byte offset of group `(r, g)`'s scale and of its quant word `k` (0..4), for a matrix of
/// `cols` columns whose data starts at band/row 0.
#[inline(always)]
pub fn w4_offsets(packing: Packing, cols: usize, r: usize, g: usize) -> (usize, [usize; 4]) {
    let ng = cols / GROUP;
    match packing {
        Packing::Contiguous | Packing::Interleaved => {
            let b = (r * ng + g) * W4_GROUP_BYTES;
            (b, [b + 2, b + 6, b + 10, b + 14])
        }
        Packing::Swizzled => {
            let (band, lane) = (r / SWIZZLE_ROWS, r % SWIZZLE_ROWS);
            let t = (band * ng + g) * SWIZZLE_TILE_BYTES;
            let w = t + 64 + 4 * lane;
            (t + 2 * lane, [w, w + 128, w + 256, w + 384])
        }
    }
}

/// The 16 quant bytes of a group with values `q` (natural order) in `packing`, as four words.
pub fn pack_w4_words(packing: Packing, q: &[u8; GROUP]) -> [[u8; 4]; 4] {
    let mut w = [[0u8; 4]; 4];
    for (k, word) in w.iter_mut().enumerate() {
        for (b, byte) in word.iter_mut().enumerate() {
            *byte = match packing {
                Packing::Contiguous => {
                    let j = 4 * k + b;
                    q[2 * j] | q[2 * j + 1] << 4
                }
                Packing::Interleaved | Packing::Swizzled => q[8 * k + b] | q[8 * k + 4 + b] << 4,
            };
        }
    }
    w
}

/// Writes group `(r, g)` (scale `d`, nibbles `q` in natural order).
pub fn write_w4_group(
    out: &mut [u8],
    packing: Packing,
    cols: usize,
    r: usize,
    g: usize,
    d: u16,
    q: &[u8; GROUP],
) {
    let (s, w) = w4_offsets(packing, cols, r, g);
    out[s..s + 2].copy_from_slice(&d.to_le_bytes());
    for (at, word) in w.iter().zip(pack_w4_words(packing, q)) {
        out[*at..*at + 4].copy_from_slice(&word);
    }
}

/// Reads group `(r, g)` back: (scale, nibbles in natural order).
pub fn read_w4_group(
    data: &[u8],
    packing: Packing,
    cols: usize,
    r: usize,
    g: usize,
) -> (u16, [u8; GROUP]) {
    let (s, w) = w4_offsets(packing, cols, r, g);
    let mut q = [0u8; GROUP];
    for (k, at) in w.iter().enumerate() {
        for b in 0..4 {
            let byte = data[at + b];
            match packing {
                Packing::Contiguous => {
                    let j = 4 * k + b;
                    q[2 * j] = byte & 0xF;
                    q[2 * j + 1] = byte >> 4;
                }
                Packing::Interleaved | Packing::Swizzled => {
                    q[8 * k + b] = byte & 0xF;
                    q[8 * k + 4 + b] = byte >> 4;
                }
            }
        }
    }
    (u16::from_le_bytes([data[s], data[s + 1]]), q)
}

/// Row `r` of a matrix in format `f` as f32.
pub fn dequantize_q_row(f: QFormat, data: &[u8], cols: usize, r: usize, out: &mut [f32]) {
    match f {
        QFormat::W8 => {
            let rb = f.matrix_bytes(1, cols);
            dequantize_row(GgmlType::Q8_0, &data[r * rb..][..rb], out);
        }
        QFormat::W4(p) => {
            for g in 0..cols / GROUP {
                let (d, q) = read_w4_group(data, p, cols, r, g);
                let d = f16_to_f32(d);
                for (o, &v) in out[g * GROUP..][..GROUP].iter_mut().zip(&q) {
                    *o = d * (v as i32 - 8) as f32;
                }
            }
        }
    }
}

/// What boot did to a model's matrices, for the report `generate`/`perplexity`/`bench` and the
/// daemon print.
#[derive(Clone, Debug, Default)]
pub struct ConversionReport {
    /// (from type, to format, how, number of matrices, bytes after)
    pub lines: Vec<(String, String, Conversion, usize, usize)>,
}

impl ConversionReport {
    pub fn add(&mut self, from: GgmlType, target: Target, how: Conversion, bytes: usize) {
        let to = match target {
            Target::Keep => from.name().to_string(),
            Target::F16 => "F16".to_string(),
            Target::Q(f) => f.name().to_string(),
        };
        let from = from.name().to_string();
        match self
            .lines
            .iter_mut()
            .find(|l| l.0 == from && l.1 == to && l.2 == how)
        {
            Some(l) => {
                l.3 += 1;
                l.4 += bytes;
            }
            None => self.lines.push((from, to, how, 1, bytes)),
        }
    }

    /// Matrices requantized (values changed).
    pub fn requantized(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.2 == Conversion::Requantized)
            .map(|l| l.3)
            .sum()
    }
}

impl fmt::Display for ConversionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (from, to, how, n, bytes)) in self.lines.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let how = match how {
                Conversion::AsIs if from == to => "kept",
                Conversion::Requantized if to == "F16" => "converted (round to nearest)",
                Conversion::AsIs => "imported as is",
                Conversion::Requantized => "requantized (round to nearest, group 32)",
            };
            write!(
                f,
                "{n} {from} -> {to} {how}, {:.1} MiB",
                *bytes as f64 / 1048576.0
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
