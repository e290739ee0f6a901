//! Weights as they are stored, viewed in place: a [`Matrix`] of rows in a GGML type or a
//! low-bit format of this module, and [`Rows`] that need not be adjacent (neuron bundles).
//! The kernels of `backend` read these views; the formats that fill them live here, below them.

use crate::model::ggml::{dequantize_row, GgmlType};
use crate::quant::QFormat;

/// A row-major weight matrix in its GGML type: each of `rows` rows holds `cols` values in
/// `ty.row_bytes(cols)` bytes.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    /// The GGML type of the bytes, or (with `q` set) the type with the same values.
    pub ty: GgmlType,
    /// Set for the low-bit formats of `crate::quant` (w8, w4 in a packing), which run the
    /// integer kernels of `crate::backend::cpu::lowbit`.
    pub q: Option<QFormat>,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl Matrix<'_> {
    /// Bytes per row. Panics when `cols` is not a whole number of blocks or `data` is short.
    pub fn row_bytes(&self) -> usize {
        let rb = self.ty.row_bytes(self.cols).unwrap_or_else(|| {
            panic!(
                "{} row of {} values is not whole blocks",
                self.ty.name(),
                self.cols
            )
        });
        assert!(
            self.data.len() >= rb * self.rows,
            "{} matrix {}x{}: {} bytes, need {}",
            self.ty.name(),
            self.rows,
            self.cols,
            self.data.len(),
            rb * self.rows
        );
        rb
    }

    /// Row `r` as f32 (an embedding lookup), in whatever layout the matrix is stored: its
    /// GGML type's blocks, or a low-bit format of `crate::quant` (w4 packings reorder the
    /// nibbles, and a swizzled band stores 32 rows together).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        match self.q {
            Some(f) => crate::quant::dequantize_q_row(f, self.data, self.cols, r, out),
            None => {
                let rb = self.row_bytes();
                dequantize_row(self.ty, &self.data[r * rb..][..rb], out)
            }
        }
    }
}

/// Rows of a GGML-typed matrix that need not be adjacent: row `r` is the `ty.row_bytes(cols)`
/// bytes at `data[offset(r)..]`, rows `stride` apart within a tile of `tile.rows` rows and
/// tiles `tile.bytes` apart. A [`Matrix`] is the case `stride == row_bytes`, one tile; neuron
/// bundles (gate rows, up rows and down columns of 32 neurons stored together) are another.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub ty: GgmlType,
    /// As in [`Matrix`]: a low-bit format of `crate::quant` (then `stride` is the row's bytes).
    pub q: Option<QFormat>,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub tile: Tile,
    pub data: &'a [u8],
}

/// How rows are grouped: `1 << shift` rows per tile (a power of two, so that finding a row's
/// tile is a shift, not a division), `bytes` from one tile's start to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub shift: u32,
    pub bytes: usize,
}

impl Tile {
    /// All rows in one tile (a plain strided matrix).
    pub const NONE: Tile = Tile {
        shift: usize::BITS - 1,
        bytes: 0,
    };

    /// Rows per tile.
    pub fn rows(&self) -> usize {
        1 << self.shift
    }

    /// Where row `r` starts, for rows `stride` apart within a tile.
    #[inline]
    pub fn offset(&self, r: usize, stride: usize) -> usize {
        (r >> self.shift) * self.bytes + (r & (self.rows() - 1)) * stride
    }
}

impl<'a> Rows<'a> {
    /// Where row `r` starts in `data`.
    #[inline]
    pub fn offset(&self, r: usize) -> usize {
        self.tile.offset(r, self.stride)
    }

    /// Bytes per row. Panics when `cols` is not whole blocks, `stride` is shorter than a row,
    /// or `data` does not reach the last row's end.
    pub fn row_bytes(&self) -> usize {
        let rb = self.ty.row_bytes(self.cols).unwrap_or_else(|| {
            panic!(
                "{} row of {} values is not whole blocks",
                self.ty.name(),
                self.cols
            )
        });
        assert!(
            self.stride >= rb,
            "stride {} < row of {rb} bytes",
            self.stride
        );
        let need = if self.rows == 0 {
            0
        } else {
            self.offset(self.rows - 1) + rb
        };
        assert!(
            self.data.len() >= need,
            "{} rows {}x{} (stride {}): {} bytes, need {need}",
            self.ty.name(),
            self.rows,
            self.cols,
            self.stride,
            self.data.len()
        );
        rb
    }

    /// Row `r`'s bytes.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.ty.row_bytes(self.cols).expect("whole blocks");
        &self.data[self.offset(r)..][..rb]
    }
}

impl<'a> From<&Matrix<'a>> for Rows<'a> {
    fn from(m: &Matrix<'a>) -> Rows<'a> {
        Rows {
            ty: m.ty,
            q: m.q,
            rows: m.rows,
            cols: m.cols,
            stride: m.ty.row_bytes(m.cols).unwrap_or(0),
            tile: Tile::NONE,
            data: m.data,
        }
    }
}

/// A part of a flash image's block (its gate rows, up rows or down columns), read as is.
impl<'a> From<crate::model::flash::Part<'a>> for Rows<'a> {
    fn from(p: crate::model::flash::Part<'a>) -> Rows<'a> {
        Rows {
            ty: p.ty,
            q: None,
            rows: p.rows,
            cols: p.cols,
            stride: p.stride,
            tile: Tile::NONE,
            data: p.data,
        }
    }
}
