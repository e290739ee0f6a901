//! Dots of single rows fetched one at a time against one input quantized once: the streamed
//! FFN's gate and up rows, which sit wherever their block landed in the weight cache, computed
//! only for the neurons a predictor had read.

use super::*;

/// An input ready for dots with rows of one type, on any thread.
pub struct RowDot<'a> {
    act: Act<'a>,
    f: ChunkFn,
    row_bytes: usize,
    block_bytes: usize,
}

impl ActScratch {
    /// `x` quantized (once) for rows of type `ty` and `x.len()` columns.
    pub fn row_dot<'a>(&'a mut self, ks: KernelSet, ty: GgmlType, x: &'a [f32]) -> RowDot<'a> {
        assert_supported(ks);
        let row_bytes = ty
            .row_bytes(x.len())
            .unwrap_or_else(|| panic!("{} columns are not whole {ty:?} blocks", x.len()));
        let act = if uses_q8(ty) {
            self.quantize(x, false, ActScales::for_types(ks, [ty]))
        } else {
            Act::plain(x)
        };
        RowDot {
            act,
            f: chunk_fn(ty, ks),
            row_bytes,
            block_bytes: ty.block_bytes(),
        }
    }
}

impl<'a> RowDot<'a> {
    /// The same input for rows of type `ty` (whose input takes the same form: int8 blocks
    /// for the quant types, floats for the float types).
    pub fn for_type(&self, ks: KernelSet, ty: GgmlType) -> RowDot<'a> {
        let x = self.act.x;
        assert_eq!(
            uses_q8(ty),
            !self.act.qs.is_empty(),
            "{ty:?} rows take their input in another form"
        );
        RowDot {
            act: self.act,
            block_bytes: ty.block_bytes(),
            f: chunk_fn(ty, ks),
            row_bytes: ty
                .row_bytes(x.len())
                .unwrap_or_else(|| panic!("{} columns are not whole {ty:?} blocks", x.len())),
        }
    }

    /// `row . x`.
    pub fn dot(&self, row: &[u8]) -> f32 {
        assert_eq!(row.len(), self.row_bytes, "one whole row");
        let mut out = [0f32];
        // SAFETY: a kernel this CPU supports (asserted when made), one whole row of
        // `row_bytes`, and `act` covers its columns (made from an input of that width).
        unsafe { (self.f)(row, self.row_bytes, self.row_bytes, &self.act, &mut out) };
        out[0]
    }
}

/// A neuron's gate and up rows dotted together, two neurons at a time, with the kernel and in
/// the order the in-memory sparse FFN uses (`matvec_pairs`): the same values to the last bit.
pub struct GateUpDot<'a> {
    gate: RowDot<'a>,
    up: RowDot<'a>,
    f4: Option<Dot4Fn>,
}

impl ActScratch {
    /// `x` quantized once for gate rows of type `gate` and up rows of type `up`.
    pub fn gate_up_dot<'a>(
        &'a mut self,
        ks: KernelSet,
        gate: GgmlType,
        up: GgmlType,
        x: &'a [f32],
    ) -> GateUpDot<'a> {
        let g = self.row_dot(ks, gate, x);
        let u = g.for_type(ks, up);
        let f4 = dot4_fn(gate, ks).filter(|_| gate == up);
        GateUpDot { gate: g, up: u, f4 }
    }
}

impl GateUpDot<'_> {
    /// `[gate0 . x, up0 . x, gate1 . x, up1 . x]` for two neurons' (gate, up) rows.
    pub fn two(&self, n0: (&[u8], &[u8]), n1: (&[u8], &[u8])) -> [f32; 4] {
        let Some(f4) = self.f4 else {
            return [
                self.gate.dot(n0.0),
                self.up.dot(n0.1),
                self.gate.dot(n1.0),
                self.up.dot(n1.1),
            ];
        };
        let rb = self.gate.row_bytes;
        for r in [n0.0, n0.1, n1.0, n1.1] {
            assert_eq!(r.len(), rb, "whole rows");
        }
        let nb = rb / self.gate.block_bytes;
        let rows = [n0.0, n0.1, n1.0, n1.1].map(|r| r.as_ptr());
        // SAFETY: a kernel this CPU supports (asserted when made), four whole rows of `nb`
        // blocks (checked above), and `act` covers their columns; no prefetch.
        unsafe { f4(rows, nb, 0, &self.gate.act) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::WorkerPool;

    /// A row's dot equals the same row's in a whole-matrix product (to rounding: the matrix
    /// kernels sum four rows at a time in another order).
    #[test]
    fn row_dots_equal_the_matrix_products() {
        let (rows, cols) = (7, 64);
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.3).sin()).collect();
        for ty in [GgmlType::Q8_0, GgmlType::F32] {
            let rb = ty.row_bytes(cols).unwrap();
            let mut data = vec![0u8; rows * rb];
            for r in 0..rows {
                let (src, dst) = (&vals[r * cols..][..cols], &mut data[r * rb..][..rb]);
                match ty {
                    GgmlType::Q8_0 => crate::model::ggml::quantize_row_q8_0(src, dst),
                    _ => {
                        for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                            d.copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
            let w = Rows {
                ty,
                q: None,
                rows,
                cols,
                stride: rb,
                tile: Tile::NONE,
                data: &data,
            };
            let pool = WorkerPool::new(1);
            let mut act = ActScratch::new(cols);
            let mut want = vec![0f32; rows];
            matvec_rows_many(
                KernelSet::best(),
                &pool,
                &mut [(w, &mut want[..])],
                &x,
                &mut act,
            );
            let d = act.row_dot(KernelSet::best(), ty, &x);
            for (r, w) in want.iter().enumerate() {
                let got = d.dot(&data[r * rb..][..rb]);
                assert!(
                    (got - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{ty:?} row {r}: {got} {w}"
                );
            }
        }
    }

    /// Two neurons' gate and up rows give matvec_pairs' values, bit for bit.
    #[test]
    fn gate_up_pairs_equal_matvec_pairs() {
        let (rows, cols) = (6, 64);
        let ty = GgmlType::Q8_0;
        let rb = ty.row_bytes(cols).unwrap();
        let mut g = vec![0u8; rows * rb];
        let mut u = vec![0u8; rows * rb];
        for r in 0..rows {
            let v: Vec<f32> = (0..cols)
                .map(|c| ((r * 31 + c * 7) % 23) as f32 - 11.0)
                .collect();
            crate::model::ggml::quantize_row_q8_0(&v, &mut g[r * rb..][..rb]);
            let w: Vec<f32> = v.iter().map(|x| x * 0.37 - 1.0).collect();
            crate::model::ggml::quantize_row_q8_0(&w, &mut u[r * rb..][..rb]);
        }
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.7).cos()).collect();
        fn view(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Rows<'_> {
            Rows {
                ty,
                q: None,
                rows,
                cols,
                stride: ty.row_bytes(cols).unwrap(),
                tile: Tile::NONE,
                data,
            }
        }
        let pool = WorkerPool::new(1);
        let mut act = ActScratch::new(cols);
        let (mut wg, mut wu) = (vec![0f32; rows], vec![0f32; rows]);
        matvec_pairs(
            KernelSet::best(),
            &pool,
            view(ty, rows, cols, &g),
            view(ty, rows, cols, &u),
            &x,
            &mut act,
            &mut wg,
            &mut wu,
            &|_, _| {},
        );
        let d = act.gate_up_dot(KernelSet::best(), ty, ty, &x);
        fn row(v: &[u8], r: usize, rb: usize) -> &[u8] {
            &v[r * rb..][..rb]
        }
        for r in (0..rows).step_by(2) {
            let got = d.two(
                (row(&g, r, rb), row(&u, r, rb)),
                (row(&g, r + 1, rb), row(&u, r + 1, rb)),
            );
            let want = [wg[r], wu[r], wg[r + 1], wu[r + 1]];
            assert_eq!(
                got.map(f32::to_bits),
                want.map(f32::to_bits),
                "rows {r}, {}",
                r + 1
            );
        }
    }
}
