//! GGUF tensors repacked into the layout the CUDA kernels read (kernels-ptx/decode.cu): per
//! matrix, struct-of-arrays — quants of all blocks, then their f16 scales (and mins or high
//! bits) — so every quant word is 4-byte aligned for dp4a. At `native` the values are the
//! file's, unchanged, and types without a kernel (Q5_1, Q4_K, Q5_K, Q6_K, BF16) become f16 at load; at
//! `f16` every matrix becomes f16; at `w8a8`/`w4a8` each matrix becomes the GGML Q8_0 or Q4_0 of
//! its role (`quant::target`), requantized exactly as the CPU backend's boot does it.

use crate::model::ggml::{dequantize_row, f32_to_f16, GgmlType};
use crate::model::TensorRef;
use crate::quant::{self, Conversion, ConversionReport, Packing, Precision, QFormat, Role, Target};

/// Types the kernels read directly; the numbers are the kernels' `type` codes (= GGML ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q8_0 = 8,
}

impl GpuType {
    pub fn of(ty: GgmlType) -> Option<GpuType> {
        Some(match ty {
            GgmlType::F32 => GpuType::F32,
            GgmlType::F16 => GpuType::F16,
            GgmlType::Q4_0 => GpuType::Q4_0,
            GgmlType::Q4_1 => GpuType::Q4_1,
            GgmlType::Q5_0 => GpuType::Q5_0,
            GgmlType::Q8_0 => GpuType::Q8_0,
            _ => return None,
        })
    }
    /// Whether its kernel takes int8 activation blocks (dp4a) rather than f32.
    pub fn int8_activations(self) -> bool {
        !matches!(self, GpuType::F32 | GpuType::F16)
    }
}

/// Byte offsets of one matrix's arrays inside the weight image (`usize::MAX`: absent).
#[derive(Clone, Copy, Debug)]
pub struct MatLayout {
    pub ty: GpuType,
    pub rows: usize,
    pub cols: usize,
    pub q: usize,
    pub d: usize,
    pub m: usize,
    pub qh: usize,
    /// Bytes of weights a product with this matrix reads.
    pub bytes: usize,
}

pub const ALIGN: usize = 256;

/// SwiGLU outputs per tile of the stacked gate/up matrix (`ImageWriter::gate_up_tiled`): one
/// int8 block of the down product's input.
pub const SWIGLU_TILE: usize = 32;

fn align(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// The image being planned (first pass, `out` = None) or written (second pass).
pub struct ImageWriter<'o> {
    pub len: usize,
    out: Option<&'o mut [u8]>,
    /// What each matrix becomes (module docs).
    pub precision: Precision,
    /// What became of each matrix, counted on the planning pass (the boot report).
    pub report: ConversionReport,
}

impl<'o> ImageWriter<'o> {
    pub fn plan() -> ImageWriter<'static> {
        ImageWriter {
            len: 0,
            out: None,
            precision: Precision::Native,
            report: ConversionReport::default(),
        }
    }
    pub fn write_into(out: &'o mut [u8]) -> ImageWriter<'o> {
        ImageWriter {
            len: 0,
            out: Some(out),
            precision: Precision::Native,
            report: ConversionReport::default(),
        }
    }

    /// Reserves `bytes` (aligned) and lets `fill` write them on the second pass.
    fn region(&mut self, bytes: usize, fill: impl FnOnce(&mut [u8])) -> usize {
        let at = align(self.len);
        self.len = at + bytes;
        if let Some(out) = self.out.as_deref_mut() {
            fill(&mut out[at..at + bytes]);
        }
        at
    }

    /// A vector (norm weights, biases) as f32.
    pub fn vector(&mut self, parts: &[TensorRef]) -> usize {
        let n: usize = parts.iter().map(|t| t.rows * t.cols).sum();
        self.region(n * 4, |dst| {
            let mut at = 0;
            for t in parts {
                let len = t.rows * t.cols;
                let mut tmp = vec![0f32; len];
                dequantize_row(t.ty, t.data, &mut tmp);
                for (d, v) in dst[at * 4..(at + len) * 4].chunks_exact_mut(4).zip(&tmp) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                at += len;
            }
        })
    }

    /// The type a matrix of file type `ty` with `cols` columns in `role` gets in the image, and
    /// the conversion that makes it (in the terms of the CPU boot's report).
    fn image_type(&self, ty: GgmlType, role: Role, cols: usize) -> (GpuType, Target) {
        let native = GpuType::of(ty);
        let target = match self.precision {
            Precision::Native => Target::Keep,
            Precision::F16 => Target::F16,
            // The packing is the CPU's affair: the GPU reads GGML's Q4_0 nibble order.
            p => quant::target(p, Packing::default(), role, ty, cols),
        };
        match (target, native) {
            (Target::Q(QFormat::W8), _) => (GpuType::Q8_0, target),
            (Target::Q(QFormat::W4(_)), _) => (GpuType::Q4_0, target),
            (Target::Keep, Some(native)) => (native, target),
            // Types without a kernel become f16.
            _ => (GpuType::F16, Target::F16),
        }
    }

    /// Matrices with the same type and columns stacked by rows into one (q|k|v), so one launch
    /// computes them all. `role` decides their type at w8a8/w4a8.
    pub fn matrix(&mut self, parts: &[TensorRef], role: Role) -> MatLayout {
        self.report_matrices(parts, role);
        self.stack(parts, role)
    }

    /// Gate and up (same type, columns and rows, rows a multiple of `SWIGLU_TILE`) stacked
    /// tile by tile: gate rows 32t..32t+32, then up rows 32t..32t+32, for t = 0, 1, ... So the
    /// 64 product rows of tile t are all that SwiGLU's outputs 32t..32t+32 (one int8 block of
    /// down's input) need, and the block that finishes a tile can make them
    /// (kernels-ptx/decode.cu, FIN_SWIGLU_TILES) instead of one block making all of them.
    pub fn gate_up_tiled<'t>(
        &mut self,
        gate: TensorRef<'t>,
        up: TensorRef<'t>,
        role: Role,
    ) -> MatLayout {
        assert!(
            gate.ty == up.ty && gate.cols == up.cols && gate.rows == up.rows,
            "gate and up differ in shape or type"
        );
        assert!(gate.rows.is_multiple_of(SWIGLU_TILE));
        self.report_matrices(&[gate, up], role);
        let row_bytes = gate.data.len() / gate.rows;
        let tile = |t: &TensorRef<'t>, i: usize| TensorRef {
            rows: SWIGLU_TILE,
            data: &t.data[i * SWIGLU_TILE * row_bytes..(i + 1) * SWIGLU_TILE * row_bytes],
            ..*t
        };
        let pieces: Vec<TensorRef<'t>> = (0..gate.rows / SWIGLU_TILE)
            .flat_map(|i| [tile(&gate, i), tile(&up, i)])
            .collect();
        self.stack(&pieces, role)
    }

    /// Counts what becomes of each matrix, on the planning pass (the boot report).
    fn report_matrices(&mut self, parts: &[TensorRef], role: Role) {
        if self.out.is_some() {
            return;
        }
        let (gty, target) = self.image_type(parts[0].ty, role, parts[0].cols);
        for t in parts {
            let how = if t.ty == ggml_of(gty) {
                Conversion::AsIs
            } else {
                Conversion::Requantized
            };
            self.report
                .add(t.ty, target, how, quant::target_bytes(target, t));
        }
    }

    /// `parts` stacked by rows into one matrix of the image type of their role.
    fn stack(&mut self, parts: &[TensorRef], role: Role) -> MatLayout {
        let cols = parts[0].cols;
        let rows: usize = parts.iter().map(|t| t.rows).sum();
        let ty0 = parts[0].ty;
        assert!(parts.iter().all(|t| t.ty == ty0 && t.cols == cols));
        let nb = cols / 32;
        let blocks = rows * nb;
        let (gty, target) = self.image_type(ty0, role, cols);
        // Requantized to GGML Q8_0/Q4_0 blocks first (write pass only, with the values of the
        // CPU's boot and of `requant`), then repacked below as if the file had held them.
        let requant = matches!(gty, GpuType::Q8_0 | GpuType::Q4_0) && ty0 != ggml_of(gty);
        let owned: Vec<Vec<u8>> = if requant && self.out.is_some() {
            let mut scratch = Vec::new();
            parts
                .iter()
                .map(|t| quant::convert_to_ggml(target, t, &mut scratch).1)
                .collect()
        } else {
            Vec::new()
        };
        let image_parts: Vec<TensorRef> = parts
            .iter()
            .enumerate()
            .map(|(i, t)| TensorRef {
                ty: if requant { ggml_of(gty) } else { t.ty },
                data: owned.get(i).map_or(t.data, |o| o.as_slice()),
                ..*t
            })
            .collect();
        let parts = image_parts.as_slice();
        let none = usize::MAX;
        // Block bytes in the file, and where d / m / qh / qs sit inside a block.
        let (bb, d_at, m_at, qh_at, qs_at, qs_len) = match gty {
            GpuType::Q8_0 => (34, 0, none, none, 2, 32),
            GpuType::Q4_0 => (18, 0, none, none, 2, 16),
            GpuType::Q4_1 => (20, 0, 2, none, 4, 16),
            GpuType::Q5_0 => (22, 0, none, 2, 6, 16),
            _ => (0, none, none, none, none, 0),
        };
        let blocks_of = |f: &mut dyn FnMut(usize, &[u8])| {
            let mut b = 0;
            for t in parts {
                for blk in t.data.chunks_exact(bb) {
                    f(b, blk);
                    b += 1;
                }
            }
        };
        let (q, d, m, qh, bytes) = match gty {
            GpuType::F32 | GpuType::F16 => {
                let width = if gty == GpuType::F32 { 4 } else { 2 };
                let q = self.region(rows * cols * width, |dst| {
                    let mut row = vec![0f32; cols];
                    let mut r = 0;
                    for t in parts {
                        let rb = t.data.len() / t.rows;
                        for src in t.data.chunks_exact(rb) {
                            let out = &mut dst[r * cols * width..(r + 1) * cols * width];
                            if t.ty == ggml_of(gty) {
                                out.copy_from_slice(src);
                            } else {
                                dequantize_row(t.ty, src, &mut row);
                                for (o, v) in out.chunks_exact_mut(2).zip(&row) {
                                    o.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
                                }
                            }
                            r += 1;
                        }
                    }
                });
                (q, none, none, none, rows * cols * width)
            }
            _ => {
                let q = self.region(blocks * qs_len, |dst| {
                    blocks_of(&mut |b, blk| {
                        dst[b * qs_len..(b + 1) * qs_len]
                            .copy_from_slice(&blk[qs_at..qs_at + qs_len])
                    })
                });
                let d = self.region(blocks * 2, |dst| {
                    blocks_of(&mut |b, blk| {
                        dst[b * 2..b * 2 + 2].copy_from_slice(&blk[d_at..d_at + 2])
                    })
                });
                let m = if m_at != none {
                    self.region(blocks * 2, |dst| {
                        blocks_of(&mut |b, blk| {
                            dst[b * 2..b * 2 + 2].copy_from_slice(&blk[m_at..m_at + 2])
                        })
                    })
                } else {
                    none
                };
                let qh = if qh_at != none {
                    self.region(blocks * 4, |dst| {
                        blocks_of(&mut |b, blk| {
                            dst[b * 4..b * 4 + 4].copy_from_slice(&blk[qh_at..qh_at + 4])
                        })
                    })
                } else {
                    none
                };
                let extra = if m_at != none { 2 } else { 0 } + if qh_at != none { 4 } else { 0 };
                (q, d, m, qh, blocks * (qs_len + 2 + extra))
            }
        };
        MatLayout {
            ty: gty,
            rows,
            cols,
            q,
            d,
            m,
            qh,
            bytes,
        }
    }
}

fn ggml_of(t: GpuType) -> GgmlType {
    match t {
        GpuType::F32 => GgmlType::F32,
        GpuType::F16 => GgmlType::F16,
        GpuType::Q4_0 => GgmlType::Q4_0,
        GpuType::Q4_1 => GgmlType::Q4_1,
        GpuType::Q5_0 => GgmlType::Q5_0,
        GpuType::Q8_0 => GgmlType::Q8_0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ggml::quantize_row_q8_0;

    /// The repacked Q4_1 matrix holds the file's blocks, split into quants / scales / mins.
    #[test]
    fn q4_1_blocks_are_split_not_changed() {
        let mut data = vec![0u8; 2 * 20 * 2]; // 2 rows x 64 cols
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let t = TensorRef {
            ty: GgmlType::Q4_1,
            cols: 64,
            rows: 2,
            data: &data,
        };
        let mut plan = ImageWriter::plan();
        let l = plan.matrix(&[t], Role::Block);
        let mut img = vec![0u8; plan.len];
        let l2 = ImageWriter::write_into(&mut img).matrix(&[t], Role::Block);
        assert_eq!((l.q, l.d, l.m), (l2.q, l2.d, l2.m));
        for b in 0..4 {
            let blk = &data[b * 20..b * 20 + 20];
            assert_eq!(&img[l.q + b * 16..l.q + b * 16 + 16], &blk[4..20]);
            assert_eq!(&img[l.d + b * 2..l.d + b * 2 + 2], &blk[0..2]);
            assert_eq!(&img[l.m + b * 2..l.m + b * 2 + 2], &blk[2..4]);
        }
        assert_eq!(l.bytes, 4 * 20);
    }

    /// Gate and up stacked tile by tile: image row 64t + j is gate row 32t + j and image row
    /// 64t + 32 + j is up row 32t + j, blocks and scales as the file holds them; the report
    /// counts two matrices, as for a plain stack.
    #[test]
    fn gate_up_tiles_alternate_32_rows_of_each() {
        let (rows, cols) = (96, 64); // three tiles, two blocks a row
        let block = |m: usize, r: usize, b: usize| {
            let mut blk = [0u8; 34];
            blk[..2].copy_from_slice(&f32_to_f16(0.5 + m as f32).to_le_bytes());
            for (j, q) in blk[2..].iter_mut().enumerate() {
                *q = (m * 100 + r + b * 7 + j) as u8;
            }
            blk
        };
        let data = |m: usize| -> Vec<u8> {
            (0..rows)
                .flat_map(|r| (0..2).flat_map(move |b| block(m, r, b)))
                .collect()
        };
        let (gate_data, up_data) = (data(0), data(1));
        let t = |data| TensorRef {
            ty: GgmlType::Q8_0,
            cols,
            rows,
            data,
        };
        let (gate, up) = (t(gate_data.as_slice()), t(up_data.as_slice()));
        let mut plan = ImageWriter::plan();
        let l = plan.gate_up_tiled(gate, up, Role::Block);
        assert_eq!(plan.report.to_string(), "2 Q8_0 -> Q8_0 kept, 0.0 MiB");
        let mut img = vec![0u8; plan.len];
        ImageWriter::write_into(&mut img).gate_up_tiled(gate, up, Role::Block);
        assert_eq!((l.rows, l.cols, l.ty), (2 * rows, cols, GpuType::Q8_0));
        for r in 0..2 * rows {
            let (tile, j) = (r / 64, r % 64);
            let (m, src_row) = (j / 32, tile * 32 + j % 32);
            for b in 0..2 {
                let want = block(m, src_row, b);
                let at = r * 2 + b;
                assert_eq!(&img[l.q + at * 32..][..32], &want[2..], "row {r} block {b}");
                assert_eq!(&img[l.d + at * 2..][..2], &want[..2], "row {r} block {b}");
            }
        }
    }

    /// Types without a kernel become f16 of their dequantized values.
    #[test]
    fn q6_k_becomes_f16() {
        let data = vec![3u8; 210];
        let t = TensorRef {
            ty: GgmlType::Q6_K,
            cols: 256,
            rows: 1,
            data: &data,
        };
        let mut plan = ImageWriter::plan();
        plan.matrix(&[t], Role::Block);
        let mut img = vec![0u8; plan.len];
        let l = ImageWriter::write_into(&mut img).matrix(&[t], Role::Block);
        assert_eq!(l.ty, GpuType::F16);
        let mut want = vec![0f32; 256];
        dequantize_row(GgmlType::Q6_K, &data, &mut want);
        for (i, w) in want.iter().enumerate() {
            let h = u16::from_le_bytes([img[l.q + 2 * i], img[l.q + 2 * i + 1]]);
            assert_eq!(h, f32_to_f16(*w));
        }
    }

    /// At w4a8 a Q4_1 block matrix becomes GGML Q4_0 and a sensitive one Q8_0, each with the
    /// values the CPU backend's boot requantization gives (`quant::quantize_w4_group`,
    /// `quantize_row_q8_0`); at native it keeps Q4_1.
    #[test]
    fn low_bit_precisions_requantize_as_the_cpu_does() {
        let mut data = vec![0u8; 2 * 20 * 2]; // 2 rows x 64 cols of Q4_1
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 13 % 251) as u8;
        }
        for blk in data.chunks_exact_mut(20) {
            blk[..2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes()); // sane scale
            blk[2..4].copy_from_slice(&f32_to_f16(-0.05).to_le_bytes()); // and min
        }
        let t = TensorRef {
            ty: GgmlType::Q4_1,
            cols: 64,
            rows: 2,
            data: &data,
        };
        let image = |precision: Precision, role: Role| {
            let mut plan = ImageWriter::plan();
            plan.precision = precision;
            let l = plan.matrix(&[t], role);
            let mut img = vec![0u8; plan.len];
            let mut w = ImageWriter::write_into(&mut img);
            w.precision = precision;
            assert_eq!(w.matrix(&[t], role).q, l.q);
            (l, img)
        };
        let mut row = vec![0f32; 64];
        let (l, img) = image(Precision::W4a8, Role::Block);
        assert_eq!(l.ty, GpuType::Q4_0);
        for r in 0..2 {
            dequantize_row(GgmlType::Q4_1, &data[r * 40..][..40], &mut row);
            for g in 0..2 {
                let b = r * 2 + g;
                let (d, q) = quant::quantize_w4_group(&row[g * 32..][..32]);
                let blk = quant::q4_0_block(d, &q);
                assert_eq!(&img[l.d + b * 2..][..2], &blk[..2]);
                assert_eq!(&img[l.q + b * 16..][..16], &blk[2..]);
            }
        }
        let (l, img) = image(Precision::W4a8, Role::Sensitive);
        assert_eq!(l.ty, GpuType::Q8_0);
        for r in 0..2 {
            dequantize_row(GgmlType::Q4_1, &data[r * 40..][..40], &mut row);
            let mut want = [0u8; 68];
            quantize_row_q8_0(&row, &mut want);
            for g in 0..2 {
                let b = r * 2 + g;
                assert_eq!(&img[l.d + b * 2..][..2], &want[g * 34..][..2]);
                assert_eq!(&img[l.q + b * 32..][..32], &want[g * 34 + 2..][..32]);
            }
        }
        assert_eq!(image(Precision::Native, Role::Block).0.ty, GpuType::Q4_1);
        // The planning pass reports what became of the matrix, as the CPU boot does.
        let report = |precision: Precision, role: Role| {
            let mut plan = ImageWriter::plan();
            plan.precision = precision;
            plan.matrix(&[t, t], role);
            plan.report.to_string()
        };
        assert_eq!(
            report(Precision::W4a8, Role::Block),
            "2 Q4_1 -> w4/swizzled requantized (round to nearest, group 32), 0.0 MiB"
        );
        assert_eq!(
            report(Precision::W4a8, Role::Sensitive),
            "2 Q4_1 -> w8 requantized (round to nearest, group 32), 0.0 MiB"
        );
        assert_eq!(
            report(Precision::F16, Role::Block),
            "2 Q4_1 -> F16 converted (round to nearest), 0.0 MiB"
        );
        assert_eq!(
            report(Precision::Native, Role::Block),
            "2 Q4_1 -> Q4_1 kept, 0.0 MiB"
        );
        assert_eq!(image(Precision::W8a8, Role::Block).0.ty, GpuType::Q8_0);
    }
}
