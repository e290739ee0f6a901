use super::*;
use crate::tables::TableError;

use crate::predict::test_rng::Rng;

fn random_table(seed: u64, layers: usize, dim: usize, neurons: usize) -> HashPredictorTable {
    let mut r = Rng(seed | 1);
    let (depth, heads, tau, oh, ot) = (4u8, 3usize, 5usize, 2usize, 4usize);
    let cols = heads * tau;
    let net = |r: &mut Rng| HashNet {
        proj: (0..dim * cols).map(|_| (r.next() % 255) as i8).collect(),
        proj_scale: (0..cols).map(|_| 0.01 + r.f().abs()).collect(),
        proj_bias: (0..cols).map(|_| r.f()).collect(),
        first_table: (0..heads << tau).map(|_| r.next()).collect(),
        middle: (0..depth as usize - 2)
            .map(|_| BinaryLayer {
                w: (0..cols * heads).map(|_| r.next()).collect(),
                thr: (0..cols)
                    .map(|_| (32 * heads as u64 + r.next() % 7 - 3) as u16)
                    .collect(),
                table: (0..heads << tau).map(|_| r.next()).collect(),
            })
            .collect(),
        out_w: (0..oh * ot * heads).map(|_| r.next()).collect(),
        out_thr: (0..oh * ot)
            .map(|_| (32 * heads as u64 + r.next() % 7 - 3) as u16)
            .collect(),
        out_table: (0..(oh << ot) * neurons.div_ceil(64))
            .map(|_| r.next())
            .collect(),
        read: (neurons / 3) as u32,
    };
    HashPredictorTable {
        model: "test".into(),
        dim: dim as u32,
        neurons: neurons as u32,
        input: PredictorInput::FfnInput,
        depth,
        heads: heads as u8,
        tau: tau as u8,
        out_heads: oh as u8,
        out_tau: ot as u8,
        sparsity: 0.5,
        target_recall: 0.9,
        seed,
        pca_dims: 3,
        layers: (0..layers).map(|_| net(&mut r)).collect(),
    }
}

/// The paper's definition in +-1 arithmetic, written plainly: each bit is a sign.
fn reference_scores(t: &HashPredictorTable, l: usize, x: &[f32]) -> Vec<u8> {
    let net = &t.layers[l];
    let (heads, tau) = (t.heads as usize, t.tau as usize);
    let cols = heads * tau;
    let pm = |words: &[u64]| -> Vec<i32> {
        (0..64 * words.len())
            .map(|i| {
                if words[i / 64] >> (i % 64) & 1 == 1 {
                    1
                } else {
                    -1
                }
            })
            .collect()
    };
    let mut y = Vec::new();
    for h in 0..heads {
        let mut idx = 0;
        for b in 0..tau {
            let c = h * tau + b;
            let dot: f32 = (0..x.len())
                .map(|i| x[i] * net.proj[i * cols + c] as f32)
                .sum();
            if dot * net.proj_scale[c] + net.proj_bias[c] >= 0.0 {
                idx |= 1 << b;
            }
        }
        y.push(net.first_table[(h << tau) + idx]);
    }
    let sign_hash = |y: &[u64], w: &[u64], thr: &[u16], h: usize, tau: usize| {
        let yv = pm(y);
        let mut idx = 0;
        for b in 0..tau {
            let c = h * tau + b;
            let wv = pm(&w[c * y.len()..][..y.len()]);
            let dot: i32 = yv.iter().zip(&wv).map(|(a, b)| a * b).sum();
            // agree > thr  <=>  dot = 2 agree - d > 2 thr - d
            if dot > 2 * thr[c] as i32 - yv.len() as i32 {
                idx |= 1 << b;
            }
        }
        idx
    };
    for m in &net.middle {
        y = (0..heads)
            .map(|h| m.table[(h << tau) + sign_hash(&y, &m.w, &m.thr, h, tau)])
            .collect();
    }
    let n = t.neurons as usize;
    let nw = n.div_ceil(64);
    let mut out = vec![0u8; n];
    let (oh, ot) = (t.out_heads as usize, t.out_tau as usize);
    for h in 0..oh {
        let idx = sign_hash(&y, &net.out_w, &net.out_thr, h, ot);
        let row = &net.out_table[((h << ot) + idx) * nw..][..nw];
        for (j, o) in out.iter_mut().enumerate() {
            *o += (row[j / 64] >> (j % 64) & 1) as u8;
        }
    }
    out
}

#[test]
fn scores_equal_the_sign_definition() {
    let (layers, dim, neurons) = (3, 40, 150);
    let t = random_table(7, layers, dim, neurons);
    t.validate().unwrap();
    let mut r = Rng(99);
    let mut out = vec![0u8; neurons];
    let mut distinct = std::collections::HashSet::new();
    for trial in 0..60 {
        let x: Vec<f32> = (0..dim).map(|_| r.f()).collect();
        let l = trial % layers;
        t.scores(l, &x, &mut out);
        assert_eq!(out, reference_scores(&t, l, &x), "trial {trial}");
        distinct.insert(out.clone());
    }
    assert!(distinct.len() > 10, "inputs give different sets");
}

#[test]
fn tables_round_trip_and_refuse_another_model_or_damage() {
    let t = random_table(3, 2, 16, 70);
    let bytes = t.encode(42);
    assert_eq!(
        HashPredictorTable::decode(&bytes, 42, 2, 16, 70).unwrap(),
        t
    );
    assert!(matches!(
        HashPredictorTable::decode(&bytes, 43, 2, 16, 70),
        Err(TableError::OtherModel { .. })
    ));
    let e = HashPredictorTable::decode(&bytes, 42, 3, 16, 70).unwrap_err();
    assert!(e.to_string().contains("predictor for 2 layers"), "{e}");
    let mut bad = bytes.clone();
    let at = bad.len() - 5;
    bad[at] ^= 0x40;
    let e = HashPredictorTable::decode(&bad, 42, 2, 16, 70).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    // A consistent header over an inconsistent payload is refused by the shape check.
    let mut t2 = t.clone();
    t2.layers[1].out_table.pop();
    let e = HashPredictorTable::decode(&t2.encode(42), 42, 2, 16, 70).unwrap_err();
    assert!(e.to_string().contains("layer 1: out_table"), "{e}");
    let mut t3 = t.clone();
    t3.layers[0].read = 71;
    let e = HashPredictorTable::decode(&t3.encode(42), 42, 2, 16, 70).unwrap_err();
    assert!(e.to_string().contains("reads 71 of 70"), "{e}");
    let e = HashPredictorTable::decode(b"LSTBthresh\0\0", 42, 2, 16, 70).unwrap_err();
    assert!(e.to_string().contains("damaged"), "{e}");
}

#[test]
fn top_scores_takes_the_highest_ties_to_the_lower_index() {
    let scores = [1u8, 3, 0, 3, 2, 1, 2, 3];
    let mut count = [0u32; 4];
    let mut out = [0u32; 8];
    let n = top_scores(&scores, 4, &mut count, &mut out);
    assert_eq!(&out[..n], &[1, 3, 4, 7]);
    let n = top_scores(&scores, 5, &mut count, &mut out);
    assert_eq!(&out[..n], &[1, 3, 4, 6, 7]);
    let n = top_scores(&scores, 6, &mut count, &mut out);
    assert_eq!(&out[..n], &[0, 1, 3, 4, 6, 7]);
    assert_eq!(top_scores(&scores, 0, &mut count, &mut out), 0);
    let n = top_scores(&scores, 20, &mut count, &mut out);
    assert_eq!(&out[..n], &[0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn votes_add_eight_neurons_at_once_without_carrying() {
    let mut r = Rng(5);
    for n in [1usize, 7, 8, 63, 64, 150, 1536, 8960] {
        let nw = n.div_ceil(64);
        let mut out = vec![0u8; n];
        let mut want = vec![0u8; n];
        // The most votes a score can take: every head, some rows all ones.
        for h in 0..MAX_OUT_HEADS {
            let row: Vec<u64> = (0..nw)
                .map(|_| if h % 5 == 0 { u64::MAX } else { r.next() })
                .collect();
            add_votes(&row, &mut out);
            for (j, w) in want.iter_mut().enumerate() {
                *w += (row[j / 64] >> (j % 64) & 1) as u8;
            }
        }
        assert_eq!(out, want, "{n} neurons");
    }
}
