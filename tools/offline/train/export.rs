//! A trained [`Net`] as the table's [`HashNet`]: exactly the hard values of the graph's
//! forward pass (the test `the_exported_table_scores_as_the_graph` holds this).

use super::net::Net;
use candle_core::{Result, Tensor, Var};
use leanstream::predict::hash::{BinaryLayer, HashNet};

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// Rows of `width` latent values (width a multiple of 64 or not) as bits: bit j of a row's
/// word j / 64 is set when value j >= 0.
fn pack_rows(v: &[f32], width: usize) -> Vec<u64> {
    let words = width.div_ceil(64);
    let mut out = vec![0u64; v.len() / width * words];
    for (r, row) in v.chunks_exact(width).enumerate() {
        for (j, &x) in row.iter().enumerate() {
            if x >= 0.0 {
                out[r * words + j / 64] |= 1 << (j % 64);
            }
        }
    }
    out
}

/// The thresholds of a binary layer whose bit is `y . w + offset >= 0` (y . w = 2 agree - d,
/// an integer of d's parity): the least m >= -offset of that parity is the lowest dot product
/// that sets the bit, so the bit is `agree > (m - 2 + d) / 2`. `Net::clamp_offsets` keeps
/// m within [2 - d, d], so the threshold within [0, d - 1].
fn thresholds(offsets: &[f32], d: usize) -> Vec<u16> {
    offsets
        .iter()
        .map(|&b| {
            let mut m = (-b).ceil() as i64;
            if (m - d as i64).rem_euclid(2) == 1 {
                m += 1;
            }
            ((m - 2 + d as i64) / 2).clamp(0, d as i64) as u16
        })
        .collect()
}

fn binary(net: &Net, w: &Var, b: &Var) -> Result<(Vec<u64>, Vec<u16>)> {
    let d = net.shape.d();
    Ok((
        pack_rows(&flat(w.as_tensor())?, d),
        thresholds(&flat(&net.offsets(b)?)?, d),
    ))
}

/// The net as a table layer, reading `read` neurons.
pub fn export(net: &Net, read: u32) -> Result<HashNet> {
    let p = net.projection()?;
    let proj = flat(&p.q)?.iter().map(|&v| v as i8).collect();
    let mut middle = Vec::new();
    for m in &net.middle {
        let (w, thr) = binary(net, &m.w, &m.b)?;
        middle.push(BinaryLayer {
            w,
            thr,
            table: pack_rows(&flat(m.table.as_tensor())?, 64),
        });
    }
    let (out_w, out_thr) = binary(net, &net.wo, &net.bo)?;
    Ok(HashNet {
        proj,
        proj_scale: flat(&p.scale)?,
        proj_bias: flat(&p.bias)?,
        first_table: pack_rows(&flat(net.t1.as_tensor())?, 64),
        middle,
        out_w,
        out_thr,
        out_table: pack_rows(
            &flat(&net.out_bits()?.affine(1.0, -0.5)?)?,
            net.shape.neurons,
        ),
        read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_set_the_bit_exactly_where_the_offset_does() {
        let d = 64usize;
        for &b in &[
            -63.0f32, -62.5, -10.2, -10.0, -0.3, 0.0, 0.7, 9.0, 9.5, 33.3, 63.0,
        ] {
            let thr = thresholds(&[b], d)[0] as i64;
            for agree in 0..=d as i64 {
                let dot = 2 * agree - d as i64;
                let graph = dot as f32 + b >= 0.0;
                assert_eq!(agree > thr, graph, "offset {b}, agree {agree}");
            }
        }
    }

    #[test]
    fn rows_pack_bit_j_into_word_j_over_64() {
        let mut v = vec![-1.0f32; 70];
        v[0] = 0.0;
        v[65] = 2.0;
        assert_eq!(pack_rows(&v, 70), vec![1, 2]);
    }
}
