use super::*;

use crate::predict::test_rng::Rng;

/// `n` rows of `bits` random bits from `r`, the padding clear.
fn random_bits(r: &mut Rng, n: usize, bits: usize) -> Vec<u64> {
    let w = bits.div_ceil(64);
    let mut v: Vec<u64> = (0..n * w).map(|_| r.next()).collect();
    for r in v.chunks_exact_mut(w) {
        let used = bits - 64 * (w - 1);
        if used < 64 {
            r[w - 1] &= (1u64 << used) - 1;
        }
    }
    v
}

fn table(binary: bool, dim: usize, n: usize, rank: usize, layers: usize) -> MlpPredictorTable {
    let mut r = Rng(5);
    let net = |r: &mut Rng| MlpNet {
        weights: if binary {
            MlpWeights::Binary {
                w1: random_bits(r, rank, dim),
                thr1: (0..rank).map(|_| (dim / 2) as u16).collect(),
                w2: random_bits(r, n, rank),
            }
        } else {
            MlpWeights::Real {
                w1: (0..dim * rank).map(|_| r.f()).collect(),
                b1: (0..rank).map(|_| r.f()).collect(),
                w2: (0..n * rank).map(|_| r.f()).collect(),
                b2: (0..n).map(|_| r.f()).collect(),
            }
        },
        read: (n / 4) as u32,
    };
    MlpPredictorTable {
        model: "test".into(),
        dim: dim as u32,
        neurons: n as u32,
        rank: rank as u32,
        input: PredictorInput::FfnInput,
        binary,
        sparsity: 0.5,
        target_recall: 0.9,
        seed: 1,
        layers: (0..layers).map(|_| net(&mut r)).collect(),
    }
}

/// The definitions in plain arithmetic: a real MLP, and a BNN in +-1 values.
fn reference(t: &MlpPredictorTable, l: usize, x: &[f32]) -> Vec<f32> {
    let (dim, n, r) = (t.dim as usize, t.neurons as usize, t.rank as usize);
    match &t.layers[l].weights {
        MlpWeights::Real { w1, b1, w2, b2 } => {
            let h: Vec<f32> = (0..r)
                .map(|k| {
                    let mut s = b1[k];
                    for i in 0..dim {
                        s += x[i] * w1[i * r + k];
                    }
                    s.max(0.0)
                })
                .collect();
            (0..n)
                .map(|j| b2[j] + (0..r).map(|k| w2[j * r + k] * h[k]).sum::<f32>())
                .collect()
        }
        MlpWeights::Binary { w1, thr1, w2 } => {
            let bit = |v: &[u64], w: usize, row: usize, i: usize| {
                if v[row * w + i / 64] >> (i % 64) & 1 == 1 {
                    1
                } else {
                    -1
                }
            };
            let sx: Vec<i32> = x.iter().map(|&v| if v >= 0.0 { 1 } else { -1 }).collect();
            let dw = dim.div_ceil(64);
            let h: Vec<i32> = (0..r)
                .map(|k| {
                    let dot: i32 = (0..dim).map(|i| sx[i] * bit(w1, dw, k, i)).sum();
                    // agree = (dot + dim) / 2 > thr
                    if (dot + dim as i32) / 2 > thr1[k] as i32 {
                        1
                    } else {
                        -1
                    }
                })
                .collect();
            let rw = r.div_ceil(64);
            (0..n)
                .map(|j| {
                    let dot: i32 = (0..r).map(|k| h[k] * bit(w2, rw, j, k)).sum();
                    ((dot + r as i32) / 2) as f32
                })
                .collect()
        }
    }
}

#[test]
fn scores_follow_the_definitions() {
    for binary in [false, true] {
        let (dim, n, rank) = (70, 90, 33);
        let t = table(binary, dim, n, rank, 2);
        t.validate().unwrap();
        let mut r = Rng(77);
        let mut hidden = vec![0f32; rank];
        let mut out = vec![0f32; n];
        for trial in 0..20 {
            let x: Vec<f32> = (0..dim).map(|_| r.f()).collect();
            t.scores(trial % 2, &x, &mut hidden, &mut out);
            let want = reference(&t, trial % 2, &x);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    }
}

#[test]
fn tables_round_trip_and_refuse_bad_ones() {
    let t = table(true, 70, 90, 33, 2);
    assert_eq!(t.name(), "bnn");
    let bytes = t.encode(9);
    assert_eq!(MlpPredictorTable::decode(&bytes, 9, 2, 70, 90).unwrap(), t);
    assert!(matches!(
        MlpPredictorTable::decode(&bytes, 8, 2, 70, 90),
        Err(TableError::OtherModel { .. })
    ));
    // Set padding bits would count as agreement: refused.
    let mut bad = t.clone();
    if let MlpWeights::Binary { w1, .. } = &mut bad.layers[0].weights {
        w1[1] |= 1 << 63;
    }
    let e = MlpPredictorTable::decode(&bad.encode(9), 9, 2, 70, 90).unwrap_err();
    assert!(e.to_string().contains("layer 0: weights"), "{e}");
    let mut mixed = table(false, 70, 90, 33, 2);
    mixed.binary = true;
    assert!(mixed.validate().is_err());
    let mut stale = table(false, 70, 90, 33, 2);
    assert_eq!(stale.name(), "dejavu");
    stale.input = PredictorInput::PrevFfnInput;
    assert_eq!(stale.name(), "dejavu-stale");
}

#[test]
fn top_read_takes_the_highest_ties_to_the_lower_index() {
    let s = [0.5f32, 2.0, -1.0, 2.0, 0.7, 0.5];
    let mut order = [0u32; 6];
    let mut out = [0u32; 6];
    let n = top_read(&s, 3, &mut order, &mut out);
    assert_eq!(&out[..n], &[1, 3, 4]);
    let n = top_read(&s, 4, &mut order, &mut out);
    assert_eq!(&out[..n], &[0, 1, 3, 4]);
    assert_eq!(top_read(&s, 0, &mut order, &mut out), 0);
    assert_eq!(top_read(&s, 9, &mut order, &mut out), 6);
}
