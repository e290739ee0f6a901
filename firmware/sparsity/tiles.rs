//! Tiles of down columns: how the sparse FFN stores the down projection of 32 neurons
//! together (its kernels: `backend::cpu::down_tiles`).
//!
//! A tile holds the down columns of `TILE_NEURONS` neurons, each of `dim` values, with one
//! scale per row of the tile (per output, shared by the tile's 32 neurons). Why a scale per row
//! and not per column block (Q8_0 columns): with one scale shared by the tile's columns, a
//! token's kept neurons in a tile add up in integers (the weights' integers x int16
//! activations, one activation scale per tile), and the floating-point work is one or two
//! multiply-adds per output row and tile instead of a convert and a multiply-add per weight,
//! which made the sparse down projection cost more per neuron than the dense one
//! (docs/BENCHMARKS.md). In a model whose down rows are group-32 blocks along the neurons
//! (Q8_0, Q4_x), a tile's row is exactly one of the model's blocks, so the tiles can hold the
//! model's own values:
//!
//! - `TileKind::Q4` (Q4_0 and Q4_1 down matrices): the blocks' 4-bit values with their f16
//!   scale d and min m, unchanged (`w = d * q + m`, Q4_0's m being `-8 d`): exact, and half the
//!   bytes of int8. Bytes of a tile: 32 columns of `dim / 2` bytes (per 32 rows, 16 bytes: row
//!   k in the low nibble of byte k, row k + 16 in its high nibble, as in a ggml block), then
//!   `dim` f16 d, then `dim` f16 m.
//! - `TileKind::Int8` (every other quantized type): int8 with an f32 scale per row, quantized at
//!   boot; a Q8_0 block is kept exactly, the others on a grid finer than their own. Bytes of a
//!   tile: 32 columns of `dim` int8, then `dim` f32 scales. (One scale per 32 x 32 square,
//!   tried first, cost SmolLM2 +0.5% perplexity at sparsity 0.)

use crate::model::ggml::{f16_to_f32, f32_to_f16, GgmlType, QK};

/// Neurons per tile (the squares' width).
pub const TILE_NEURONS: usize = 32;

/// How a tile holds its columns (see the module's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileKind {
    /// int8, one f32 scale per row, quantized at boot.
    Int8,
    /// A Q4_0/Q4_1 model's own 4-bit values, f16 scale and min per row.
    Q4,
}

impl TileKind {
    /// The kind of tile that holds a down matrix of type `ty` (quantized types only).
    pub fn for_type(ty: GgmlType) -> TileKind {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => TileKind::Q4,
            _ => TileKind::Int8,
        }
    }

    /// Bytes of one column of `dim` values.
    pub fn column_bytes(self, dim: usize) -> usize {
        match self {
            TileKind::Int8 => dim,
            TileKind::Q4 => dim / 2,
        }
    }

    /// Bytes of one tile of down columns of `dim` values (`dim` a multiple of 32).
    pub fn tile_bytes(self, dim: usize) -> usize {
        TILE_NEURONS * self.column_bytes(dim) + dim * 4
    }
}

/// Quantizes one int8 tile. `cols` holds `m <= 32` down columns of `dim` values back to back (a
/// last tile may be short); the missing columns are zero.
pub fn quantize_tile(cols: &[f32], dim: usize, dst: &mut [u8]) {
    assert!(
        dim.is_multiple_of(QK),
        "rows of {dim} values are not 32-groups"
    );
    assert_eq!(
        dst.len(),
        TileKind::Int8.tile_bytes(dim),
        "tile of {} bytes",
        dst.len()
    );
    assert!(cols.len().is_multiple_of(dim) && cols.len() / dim <= TILE_NEURONS);
    let m = cols.len() / dim;
    dst.fill(0);
    let (q, scales) = dst.split_at_mut(TILE_NEURONS * dim);
    for (r, s) in scales.chunks_exact_mut(4).enumerate() {
        let amax = (0..m).fold(0f32, |a, i| a.max(cols[i * dim + r].abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for i in 0..m {
            q[i * dim + r] = (cols[i * dim + r] * id).round() as i8 as u8;
        }
        s.copy_from_slice(&d.to_le_bytes());
    }
}

/// Copies tile `t` (neurons `32 t ..`) of a Q4_0 or Q4_1 down matrix `down` (`dim` rows of
/// `n` values, `n` a multiple of 32) into a `TileKind::Q4` tile, value for value.
pub fn q4_tile_from_blocks(
    ty: GgmlType,
    down: &[u8],
    n: usize,
    dim: usize,
    t: usize,
    dst: &mut [u8],
) {
    assert!(
        matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1),
        "{} is not a Q4 type",
        ty.name()
    );
    assert!(
        dim.is_multiple_of(QK) && n.is_multiple_of(QK),
        "{dim} x {n} is not in 32-groups"
    );
    assert_eq!(
        dst.len(),
        TileKind::Q4.tile_bytes(dim),
        "tile of {} bytes",
        dst.len()
    );
    let row_bytes = ty.row_bytes(n).expect("whole blocks");
    let bb = ty.block_bytes();
    let (q, scales) = dst.split_at_mut(TILE_NEURONS * dim / 2);
    let (d_out, m_out) = scales.split_at_mut(2 * dim);
    q.fill(0);
    for r in 0..dim {
        let block = &down[r * row_bytes + t * bb..][..bb];
        let d = u16::from_le_bytes([block[0], block[1]]);
        let (m, qs) = match ty {
            GgmlType::Q4_1 => (u16::from_le_bytes([block[2], block[3]]), &block[4..20]),
            // w = d * (q - 8): the min is -8 d, exact in f16 (a power-of-two multiple).
            _ => (f32_to_f16(-8.0 * f16_to_f32(d)), &block[2..18]),
        };
        d_out[2 * r..2 * r + 2].copy_from_slice(&d.to_le_bytes());
        m_out[2 * r..2 * r + 2].copy_from_slice(&m.to_le_bytes());
        // Neuron e of the block: the low nibble of byte e, or the high one of byte e - 16.
        for e in 0..TILE_NEURONS {
            let v = if e < 16 { qs[e] & 15 } else { qs[e - 16] >> 4 };
            let at = e * dim / 2 + (r / QK) * 16 + (r % QK) % 16;
            q[at] |= if r % QK < 16 { v } else { v << 4 };
        }
    }
}

/// One layer's down columns as tiles: tile t starts at `data[t * stride]`.
#[derive(Clone, Copy, Debug)]
pub struct DownTiles<'a> {
    pub kind: TileKind,
    pub data: &'a [u8],
    /// Bytes from one tile to the next (tiles may sit inside larger bundles).
    pub stride: usize,
    /// Neurons (columns).
    pub n: usize,
    /// Values per column (outputs).
    pub dim: usize,
}

impl<'a> DownTiles<'a> {
    pub fn tile(&self, t: usize) -> &'a [u8] {
        &self.data[t * self.stride..][..self.kind.tile_bytes(self.dim)]
    }

    /// Neuron j's column.
    pub fn column(&self, j: usize) -> &'a [u8] {
        let cb = self.kind.column_bytes(self.dim);
        &self.tile(j / TILE_NEURONS)[(j % TILE_NEURONS) * cb..][..cb]
    }

    /// The value of row `r` of neuron `j`'s column (for tests and references).
    pub fn value(&self, j: usize, r: usize) -> f32 {
        let (col, dim) = (self.column(j), self.dim);
        let scales = &self.tile(j / TILE_NEURONS)[TILE_NEURONS * self.kind.column_bytes(dim)..];
        match self.kind {
            TileKind::Int8 => col[r] as i8 as f32 * f32_at(scales, r),
            TileKind::Q4 => {
                let (d, m) = q4_scales_at(scales, dim, r);
                d * q4_at(col, r) as f32 + m
            }
        }
    }
}

/// Row `r` of a Q4 column.
pub fn q4_at(col: &[u8], r: usize) -> u8 {
    let b = col[(r / QK) * 16 + (r % QK) % 16];
    if r % QK < 16 {
        b & 15
    } else {
        b >> 4
    }
}

pub fn f32_at(scales: &[u8], r: usize) -> f32 {
    f32::from_le_bytes(scales[4 * r..4 * r + 4].try_into().expect("4 bytes"))
}

/// (d, m) of row `r` of a Q4 tile.
pub fn q4_scales_at(scales: &[u8], dim: usize, r: usize) -> (f32, f32) {
    let h = |at: usize| f16_to_f32(u16::from_le_bytes([scales[at], scales[at + 1]]));
    (h(2 * r), h(2 * dim + 2 * r))
}
