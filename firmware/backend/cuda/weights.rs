//! GGUF tensors repacked into the layout the CUDA kernels read (kernels-ptx/decode.cu): per
//! matrix, struct-of-arrays — quants of all blocks, then their f16 scales (and mins or high
//! bits) — so every quant word is 4-byte aligned for dp4a. At `native` the values are the
//! file's, unchanged and in their stored bytes (the K-quants' super-blocks too: `kquant`), and
//! only types without a kernel (BF16) become f16 at load; at `f16` every matrix becomes f16;
//! at `w8a8`/`w4a8` each matrix becomes the GGML Q8_0 or Q4_0 of its role (`quant::target`),
//! requantized exactly as the CPU backend's boot does it.

use super::kquant;
use crate::model::ggml::{dequantize_row, f32_to_f16, GgmlType};
use crate::model::TensorRef;
use crate::quant::{self, Conversion, ConversionReport, Packing, Precision, QFormat, Role, Target};

/// Types the kernels read directly; the numbers are the kernels' `type` codes (= GGML ids).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
}

impl GpuType {
    pub fn of(ty: GgmlType) -> Option<GpuType> {
        Some(match ty {
            GgmlType::F32 => GpuType::F32,
            GgmlType::F16 => GpuType::F16,
            GgmlType::Q4_0 => GpuType::Q4_0,
            GgmlType::Q4_1 => GpuType::Q4_1,
            GgmlType::Q5_0 => GpuType::Q5_0,
            GgmlType::Q5_1 => GpuType::Q5_1,
            GgmlType::Q8_0 => GpuType::Q8_0,
            GgmlType::Q4_K => GpuType::Q4_K,
            GgmlType::Q5_K => GpuType::Q5_K,
            GgmlType::Q6_K => GpuType::Q6_K,
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
            GpuType::Q5_1 => (24, 0, 2, 4, 8, 16),
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
            GpuType::Q4_K | GpuType::Q5_K | GpuType::Q6_K => self.kquant_arrays(parts, blocks),
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

impl ImageWriter<'_> {
    /// The arrays of a K-quant matrix of `blocks` blocks of 32 (`kquant`'s layout): (q, d, m,
    /// qh, bytes), `usize::MAX` for an array the type has not. Reserved first, then filled in
    /// one pass over the stored super-blocks (write pass only).
    fn kquant_arrays(
        &mut self,
        parts: &[TensorRef],
        blocks: usize,
    ) -> (usize, usize, usize, usize, usize) {
        let ty = parts[0].ty;
        let (q_len, d_len, m_len, qh_len) = kquant::array_bytes(ty);
        let mut reserve = |len: usize| {
            if len == 0 {
                usize::MAX
            } else {
                self.region(len, |_| {})
            }
        };
        let supers = blocks / kquant::GROUPS;
        let q = reserve(blocks * q_len);
        let m = reserve(blocks * m_len);
        let qh = reserve(blocks * qh_len);
        let d = reserve(supers * d_len);
        if let Some(out) = self.out.as_deref_mut() {
            let mut n = 0;
            for t in parts {
                assert!(t.cols.is_multiple_of(kquant::QK_K));
                for sb in t.data.chunks_exact(ty.block_bytes()) {
                    out[d + n * d_len..][..d_len].copy_from_slice(kquant::super_header(ty, sb));
                    for g in 0..kquant::GROUPS {
                        let kb = kquant::block(ty, sb, g);
                        let at = n * kquant::GROUPS + g;
                        out[q + at * q_len..][..q_len].copy_from_slice(&kb.nibbles);
                        if m_len > 0 {
                            out[m + at * m_len..][..m_len].copy_from_slice(&kb.scales);
                        }
                        match ty {
                            GgmlType::Q5_K => {
                                out[qh + at * 4..][..4].copy_from_slice(&kb.fifth.to_le_bytes())
                            }
                            GgmlType::Q6_K => {
                                out[qh + at * qh_len..][..qh_len].copy_from_slice(&kb.pairs)
                            }
                            _ => {}
                        }
                    }
                    n += 1;
                }
            }
            assert_eq!(n, supers, "super-blocks of the stacked matrix");
        }
        let bytes = blocks * (q_len + m_len + qh_len) + supers * d_len;
        (q, d, m, qh, bytes)
    }
}

fn ggml_of(t: GpuType) -> GgmlType {
    match t {
        GpuType::F32 => GgmlType::F32,
        GpuType::F16 => GgmlType::F16,
        GpuType::Q4_0 => GgmlType::Q4_0,
        GpuType::Q4_1 => GgmlType::Q4_1,
        GpuType::Q5_0 => GgmlType::Q5_0,
        GpuType::Q5_1 => GgmlType::Q5_1,
        GpuType::Q8_0 => GgmlType::Q8_0,
        GpuType::Q4_K => GgmlType::Q4_K,
        GpuType::Q5_K => GgmlType::Q5_K,
        GpuType::Q6_K => GgmlType::Q6_K,
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

    /// Types without a kernel (BF16) become f16 of their dequantized values.
    #[test]
    fn bf16_becomes_f16() {
        let data: Vec<u8> = (0..32u16)
            .flat_map(|i| (0x3f80u16 + 16 * i).to_le_bytes()) // bf16 1.0, 1.125, ...
            .collect();
        let t = TensorRef {
            ty: GgmlType::BF16,
            cols: 32,
            rows: 1,
            data: &data,
        };
        let mut plan = ImageWriter::plan();
        plan.matrix(&[t], Role::Block);
        assert_eq!(
            plan.report.to_string(),
            "1 BF16 -> F16 converted (round to nearest), 0.0 MiB"
        );
        let mut img = vec![0u8; plan.len];
        let l = ImageWriter::write_into(&mut img).matrix(&[t], Role::Block);
        assert_eq!(l.ty, GpuType::F16);
        let mut want = vec![0f32; 32];
        dequantize_row(GgmlType::BF16, &data, &mut want);
        for (i, w) in want.iter().enumerate() {
            let h = u16::from_le_bytes([img[l.q + 2 * i], img[l.q + 2 * i + 1]]);
            assert_eq!(h, f32_to_f16(*w));
        }
    }

    /// Rows of `ty` (2 rows x 512 columns: two super-blocks a row) of arbitrary bytes with a
    /// sane f16 scale in every super-block.
    fn kquant_rows(ty: GgmlType, seed: usize) -> Vec<u8> {
        let sb = ty.block_bytes();
        let mut data: Vec<u8> = (0..4 * sb)
            .map(|i| ((i * 37 + seed * 101) % 253) as u8)
            .collect();
        let d_at = if ty == GgmlType::Q6_K { 208 } else { 0 };
        for blk in data.chunks_exact_mut(sb) {
            blk[d_at..d_at + 2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
        }
        data
    }

    /// At `native` the K-quants (and Q5_1) are kept in their own kernels' layout, at their
    /// stored size (the boot plan's count, the bytes a token reads), and the boot report says
    /// so; every block of the image holds the stored block's values (`kquant::block`).
    #[test]
    fn k_quants_stay_native_at_their_stored_size() {
        for (ty, gty) in [
            (GgmlType::Q4_K, GpuType::Q4_K),
            (GgmlType::Q5_K, GpuType::Q5_K),
            (GgmlType::Q6_K, GpuType::Q6_K),
        ] {
            let data = kquant_rows(ty, ty as usize);
            let t = TensorRef {
                ty,
                cols: 512,
                rows: 2,
                data: &data,
            };
            // q|k|v-like: two matrices stacked into one launch.
            let mut plan = ImageWriter::plan();
            let l = plan.matrix(&[t, t], Role::Block);
            assert_eq!(l.ty, gty);
            assert_eq!(l.bytes, 2 * data.len(), "{}: stored size", ty.name());
            let name = ty.name();
            assert_eq!(
                plan.report.to_string(),
                format!("2 {name} -> {name} kept, 0.0 MiB")
            );
            // The image is the arrays and their alignment, nothing more.
            assert!(
                plan.len <= l.bytes + 4 * ALIGN,
                "{}: image {} bytes",
                name,
                plan.len
            );
            let mut img = vec![0u8; plan.len];
            let l2 = ImageWriter::write_into(&mut img).matrix(&[t, t], Role::Block);
            assert_eq!((l.q, l.d, l.m, l.qh), (l2.q, l2.d, l2.m, l2.qh));
            let (q_len, d_len, m_len, qh_len) = kquant::array_bytes(ty);
            for n in 0..8 {
                // Super-block n of the stack: the second matrix repeats the first.
                let sb = &data[(n % 4) * ty.block_bytes()..][..ty.block_bytes()];
                assert_eq!(
                    &img[l.d + n * d_len..][..d_len],
                    kquant::super_header(ty, sb),
                    "{name} super-block {n}"
                );
                for g in 0..kquant::GROUPS {
                    let b = n * kquant::GROUPS + g;
                    let want = kquant::block(ty, sb, g);
                    assert_eq!(&img[l.q + b * q_len..][..q_len], &want.nibbles);
                    if m_len > 0 {
                        assert_eq!(&img[l.m + b * m_len..][..m_len], &want.scales);
                    }
                    match ty {
                        GgmlType::Q5_K => {
                            assert_eq!(&img[l.qh + b * 4..][..4], &want.fifth.to_le_bytes())
                        }
                        GgmlType::Q6_K => {
                            assert_eq!(&img[l.qh + b * qh_len..][..qh_len], &want.pairs)
                        }
                        _ => assert_eq!(l.qh, usize::MAX),
                    }
                }
            }
        }
        // Q5_1: quants, scales, mins and high bits split, not changed.
        let mut data = vec![0u8; 2 * 24];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 11 % 251) as u8;
        }
        let t = TensorRef {
            ty: GgmlType::Q5_1,
            cols: 32,
            rows: 2,
            data: &data,
        };
        let mut plan = ImageWriter::plan();
        let l = plan.matrix(&[t], Role::Block);
        assert_eq!((l.ty, l.bytes), (GpuType::Q5_1, 48));
        let mut img = vec![0u8; plan.len];
        ImageWriter::write_into(&mut img).matrix(&[t], Role::Block);
        for b in 0..2 {
            let blk = &data[b * 24..][..24];
            assert_eq!(&img[l.d + b * 2..][..2], &blk[0..2]);
            assert_eq!(&img[l.m + b * 2..][..2], &blk[2..4]);
            assert_eq!(&img[l.qh + b * 4..][..4], &blk[4..8]);
            assert_eq!(&img[l.q + b * 16..][..16], &blk[8..24]);
        }
    }

    /// At w8a8 a K-quant matrix is requantized as any other (the CPU boot's values), and at
    /// f16 converted: `native` is the only precision that keeps it.
    #[test]
    fn k_quants_convert_at_the_other_precisions() {
        let data = kquant_rows(GgmlType::Q4_K, 3);
        let t = TensorRef {
            ty: GgmlType::Q4_K,
            cols: 512,
            rows: 2,
            data: &data,
        };
        for (p, want) in [
            (Precision::W8a8, GpuType::Q8_0),
            (Precision::F16, GpuType::F16),
        ] {
            let mut plan = ImageWriter::plan();
            plan.precision = p;
            assert_eq!(plan.matrix(&[t], Role::Block).ty, want);
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
