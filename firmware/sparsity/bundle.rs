//! Neuron bundles and the sparse SwiGLU over them.
//!
//! A layer's FFN as bundles: for neuron j, gate row j, up row j and down column j, so computing
//! a subset of neurons touches only their bundles. Bundles are stored together in tiles of
//! `TILE` neurons: the tile's gate rows, then its up rows, then its down columns. Why tiles and
//! not one neuron's three parts back to back: scoring scans the gate (and up) rows of every
//! neuron, and with parts interleaved neuron by neuron the CPU's stream prefetcher drags the
//! down columns it skips through the cache too, which made the sparse FFN slower than the dense
//! one (docs/BENCHMARKS.md); a tile keeps each part's rows adjacent over 32 neurons.
//!
//! Gate and up rows are the model's bytes, unchanged. The down matrix is stored by rows of
//! `dim` (one row per output), so its column j is gathered at boot. By default
//! (`BundleDown::Tiles`) a tile's down columns are held with one scale per output row and tile
//! (`backend::cpu::down_tiles`), whose kernels add a tile's kept neurons up in integers: a
//! Q4_0/Q4_1 down matrix's own 4-bit values, unchanged, and every other quantized type as int8
//! (exact for Q8_0); float down matrices (F32, F16, BF16) keep their own columns, exactly. The
//! ablations store each column in the down tensor's own type or in Q8_0 and add them in
//! floating point (`backend::cpu::axpy`); K-quants cannot hold a column of `dim` values
//! (256-value super-blocks), so their columns are Q8_0. Where the columns are quantized again,
//! that is the one difference between the bundles and the model; the quality report measures
//! it (oracle at sparsity 0 against dense).
//!
//! SwiGLU is a sum over neurons, so the sparse FFN over a set of neurons, in any order, is the
//! dense FFN restricted to that set (LeanStream paper 3.2.2, item 2); `tests` check it.

use super::tiles::{DownTiles, TileKind};
use super::BundleDown;
use crate::boot::{BootError, Carver, Plan};
use crate::model::ggml::{dequantize_row, f32_to_f16, quantize_row_q8_0, GgmlType, QK};
use crate::model::TensorRef;
use crate::quant::view::{Rows, Tile};
use std::fmt;

/// One layer's FFN as neuron bundles, in the FFN arena.
#[derive(Clone, Copy, Debug)]
pub struct Bundles<'a> {
    /// Neurons (the FFN's hidden width).
    pub n: usize,
    /// Model width: gate and up rows, and down columns, hold `dim` values.
    pub dim: usize,
    /// Bytes per tile of `TILE` bundles.
    pub tile_bytes: usize,
    /// Gate rows and up rows, each `n` rows of `dim` values, tiled.
    pub gate: Rows<'a>,
    pub up: Rows<'a>,
    /// Down columns, `n` of `dim` values.
    pub down: Down<'a>,
}

/// How a layer's bundles hold their down columns (`BundleDown`).
#[derive(Clone, Copy, Debug)]
pub enum Down<'a> {
    /// One tile of `TILE` columns per bundle tile (`down_tiles`).
    Tiles(DownTiles<'a>),
    /// One row of a GGML type per column.
    Columns(Rows<'a>),
}

/// Whether bundles may store down columns in `ty` (a column of `n` values in whole 32-groups):
/// the types the CPU backend's axpy kernels handle (`backend::cpu::axpy` asserts it).
pub fn column_type_supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
    )
}

/// The type a bundle stores down columns in. `BundleDown::Model`: the down tensor's own when
/// a column of `dim` values fits it and the axpy kernels handle it, else Q8_0.
/// `BundleDown::AtLeast8Bit` (the default): the same, but types under 8 bits become Q8_0, since
/// quantizing an already 4- or 5-bit column again costs quality (measured in docs/SPARSITY.md).
pub fn down_column_type(down: GgmlType, dim: usize, how: BundleDown) -> GgmlType {
    let low_bit = matches!(
        down,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1
    );
    if how != BundleDown::Model && low_bit {
        return GgmlType::Q8_0;
    }
    if column_type_supported(down) && down.row_bytes(dim).is_some() {
        down
    } else {
        GgmlType::Q8_0
    }
}

/// Whether a down matrix of type `down` is held as tiles (`down_tiles`): the default for
/// quantized types; float types keep exact columns of their own type.
fn held_as_tiles(down: GgmlType, how: BundleDown) -> bool {
    how == BundleDown::Tiles && !matches!(down, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Why a layer's FFN cannot be held as bundles.
#[derive(Debug)]
pub enum BundleError {
    /// gate, up and down (rows x cols) are not one FFN.
    Shapes {
        gate: (usize, usize),
        up: (usize, usize),
        down: (usize, usize),
    },
    /// A model width that is not a multiple of 32.
    Width(usize),
    /// `what` rows of `dim` values are not whole blocks of `ty`.
    PartialBlocks {
        what: &'static str,
        dim: usize,
        ty: GgmlType,
    },
    /// The FFN arena is short.
    Arena(BootError),
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BundleError::Shapes { gate, up, down } => write!(
                f,
                "FFN shapes disagree: gate {}x{}, up {}x{}, down {}x{}",
                gate.0, gate.1, up.0, up.1, down.0, down.1
            ),
            BundleError::Width(dim) => write!(
                f,
                "bundles need a model width that is a multiple of 32, not {dim}"
            ),
            BundleError::PartialBlocks { what, dim, ty } => write!(
                f,
                "{what} rows of {dim} values are not whole {} blocks",
                ty.name()
            ),
            BundleError::Arena(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BundleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BundleError::Arena(e) => Some(e),
            _ => None,
        }
    }
}

impl From<BootError> for BundleError {
    fn from(e: BootError) -> Self {
        BundleError::Arena(e)
    }
}

fn seg_bytes(ty: GgmlType, dim: usize, what: &'static str) -> Result<usize, BundleError> {
    ty.row_bytes(dim)
        .ok_or(BundleError::PartialBlocks { what, dim, ty })
}

/// Neurons per tile of bundles (a power of two and a multiple of 4, the kernels' row group).
pub const TILE: usize = 32;

/// (gate bytes, up bytes, down column bytes) of one bundle (down: 0 for tiles), the
/// offset of the down part in a tile, and the bytes of a tile of `TILE`.
fn layout(
    gate: &TensorRef,
    up: &TensorRef,
    down: &TensorRef,
    how: BundleDown,
) -> Result<(usize, usize, usize, usize, usize), BundleError> {
    let dim = gate.cols;
    if up.cols != dim || down.rows != dim || gate.rows != up.rows || down.cols != gate.rows {
        return Err(BundleError::Shapes {
            gate: (gate.rows, gate.cols),
            up: (up.rows, up.cols),
            down: (down.rows, down.cols),
        });
    }
    if !dim.is_multiple_of(QK) {
        return Err(BundleError::Width(dim));
    }
    let g = seg_bytes(gate.ty, dim, "gate")?;
    let u = seg_bytes(up.ty, dim, "up")?;
    let (d, down_part) = if held_as_tiles(down.ty, how) {
        (0, TileKind::for_type(down.ty).tile_bytes(dim))
    } else {
        let d = seg_bytes(down_column_type(down.ty, dim, how), dim, "down")?;
        (d, TILE * d)
    };
    let down_at = TILE * (g + u);
    Ok((g, u, d, down_at, (down_at + down_part).next_multiple_of(64)))
}

impl<'a> Bundles<'a> {
    /// Bytes the bundles of one layer take in the FFN arena.
    pub fn plan(
        plan: &mut Plan,
        gate: &TensorRef,
        up: &TensorRef,
        down: &TensorRef,
        how: BundleDown,
    ) -> Result<(), BundleError> {
        let (.., tile_bytes) = layout(gate, up, down, how)?;
        plan.add_bytes(tile_bytes * gate.rows.div_ceil(TILE));
        Ok(())
    }

    /// Builds one layer's bundles in the arena: gate and up rows copied, down columns gathered
    /// and quantized. Refuses a model the bundles cannot hold, and an arena that is short.
    pub fn build(
        c: &mut Carver<'a>,
        gate: &TensorRef,
        up: &TensorRef,
        down: &TensorRef,
        how: BundleDown,
    ) -> Result<Bundles<'a>, BundleError> {
        let (gb, ub, db, down_at, tile_bytes) = layout(gate, up, down, how)?;
        let (n, dim) = (gate.rows, gate.cols);
        let data = c.take::<u8>(tile_bytes * n.div_ceil(TILE))?;
        // Where each part of neuron j's bundle starts.
        let at = |j: usize, part: usize, bytes: usize| {
            (j / TILE) * tile_bytes + part + (j % TILE) * bytes
        };
        let up_at = TILE * gb;
        // The down matrix as f32, [dim][n], to read columns from (boot only).
        let mut dense = vec![0f32; dim * n];
        let drb = down.ty.row_bytes(n).expect("validated tensor");
        for (r, out) in dense.chunks_exact_mut(n).enumerate() {
            dequantize_row(down.ty, &down.data[r * drb..][..drb], out);
        }
        let dty = down_column_type(down.ty, dim, how);
        let tiles = held_as_tiles(down.ty, how);
        let kind = TileKind::for_type(down.ty);
        let mut cols = vec![0f32; TILE * dim];
        for t in 0..n.div_ceil(TILE) {
            let js = t * TILE..((t + 1) * TILE).min(n);
            for (c, j) in js.clone().enumerate() {
                data[at(j, 0, gb)..][..gb].copy_from_slice(&gate.data[j * gb..][..gb]);
                data[at(j, up_at, ub)..][..ub].copy_from_slice(&up.data[j * ub..][..ub]);
                let col = &mut cols[c * dim..][..dim];
                for (i, v) in col.iter_mut().enumerate() {
                    *v = dense[i * n + j];
                }
                if !tiles {
                    quantize_row(dty, col, &mut data[at(j, down_at, db)..][..db]);
                }
            }
            if tiles {
                let part = &mut data[t * tile_bytes + down_at..][..kind.tile_bytes(dim)];
                match kind {
                    TileKind::Q4 => {
                        super::tiles::q4_tile_from_blocks(down.ty, down.data, n, dim, t, part)
                    }
                    TileKind::Int8 => {
                        super::tiles::quantize_tile(&cols[..js.len() * dim], dim, part)
                    }
                }
            }
        }
        let data: &'a [u8] = data;
        let rows = |ty, off: usize, bytes: usize| Rows {
            ty,
            q: None,
            rows: n,
            cols: dim,
            stride: bytes,
            tile: Tile {
                shift: TILE.trailing_zeros(),
                bytes: tile_bytes,
            },
            data: &data[off..],
        };
        Ok(Bundles {
            n,
            dim,
            tile_bytes,
            gate: rows(gate.ty, 0, gb),
            up: rows(up.ty, up_at, ub),
            down: if tiles {
                Down::Tiles(DownTiles {
                    kind,
                    data: &data[down_at..],
                    stride: tile_bytes,
                    n,
                    dim,
                })
            } else {
                Down::Columns(rows(dty, down_at, db))
            },
        })
    }
}

/// Quantizes `src` into one row of `ty` (ggml's reference quantizers, bit for bit).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        Some(dst.len()),
        ty.row_bytes(src.len()),
        "quantize_row {}",
        ty.name()
    );
    let f16 = |v: f32| f32_to_f16(v).to_le_bytes();
    match ty {
        GgmlType::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16(*v));
            }
        }
        GgmlType::BF16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                let u = v.to_bits();
                let b = if (u & 0x7fff_ffff) > 0x7f80_0000 {
                    (u >> 16) | 64
                } else {
                    (u + (0x7fff + ((u >> 16) & 1))) >> 16
                };
                d.copy_from_slice(&(b as u16).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => quantize_row_q8_0(src, dst),
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let five = ty == GgmlType::Q5_0;
            for (x, y) in src
                .chunks_exact(QK)
                .zip(dst.chunks_exact_mut(ty.block_bytes()))
            {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in x {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / if five { -16.0 } else { -8.0 };
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                y[..2].copy_from_slice(&f16(d));
                let (off, top) = if five { (16.5, 31) } else { (8.5, 15) };
                let mut qh = 0u32;
                let qs = if five { 6 } else { 2 };
                for j in 0..QK / 2 {
                    let x0 = ((x[j] * id + off) as i8).min(top) as u8;
                    let x1 = ((x[QK / 2 + j] * id + off) as i8).min(top) as u8;
                    y[qs + j] = (x0 & 0xF) | ((x1 & 0xF) << 4);
                    qh |= (((x0 & 0x10) >> 4) as u32) << j;
                    qh |= (((x1 & 0x10) >> 4) as u32) << (j + QK / 2);
                }
                if five {
                    y[2..6].copy_from_slice(&qh.to_le_bytes());
                }
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let five = ty == GgmlType::Q5_1;
            for (x, y) in src
                .chunks_exact(QK)
                .zip(dst.chunks_exact_mut(ty.block_bytes()))
            {
                let min = x.iter().copied().fold(f32::MAX, f32::min);
                let max = x.iter().copied().fold(-f32::MAX, f32::max);
                let d = (max - min) / if five { 31.0 } else { 15.0 };
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                y[..2].copy_from_slice(&f16(d));
                y[2..4].copy_from_slice(&f16(min));
                let qs = if five { 8 } else { 4 };
                let mut qh = 0u32;
                for j in 0..QK / 2 {
                    let mut x0 = ((x[j] - min) * id + 0.5) as u8;
                    let mut x1 = ((x[QK / 2 + j] - min) * id + 0.5) as u8;
                    if !five {
                        x0 = x0.min(15);
                        x1 = x1.min(15);
                    }
                    y[qs + j] = (x0 & 0xF) | ((x1 & 0xF) << 4);
                    qh |= (((x0 & 0x10) >> 4) as u32) << j;
                    qh |= (((x1 & 0x10) >> 4) as u32) << (j + QK / 2);
                }
                if five {
                    y[4..8].copy_from_slice(&qh.to_le_bytes());
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            panic!("bundles store K-quant columns as Q8_0")
        }
    }
}
