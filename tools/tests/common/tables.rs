//! Predictor tables made up for tests: one voting for a fixed set of neurons, and one reading
//! the residual after the previous FFN whose guesses move with its input (speculate-and-refine).
//! Shared by tests/stream.rs and the GPU tests (tests/cuda/stream_engine.rs).

use leanstream::model::flash::FlashImage;
use leanstream::predict::hash::{HashNet, HashPredictorTable, PredictorInput};

/// A hash table whose hashes always pick bucket 0 (thresholds no input can pass), so it votes
/// for one fixed set of neurons: `set`, reading `read` of them.
pub fn fixed_hash_table(
    img: &FlashImage,
    set: &dyn Fn(usize) -> bool,
    read: u32,
) -> HashPredictorTable {
    let g = img.geometry(0);
    let (dim, n) = (g.dim as usize, g.neurons as usize);
    let words = n.div_ceil(64);
    let mut row0 = vec![0u64; words];
    for j in (0..n).filter(|&j| set(j)) {
        row0[j / 64] |= 1 << (j % 64);
    }
    let net = HashNet {
        proj: vec![0; dim],
        proj_scale: vec![1.0],
        proj_bias: vec![0.0],
        first_table: vec![u64::MAX, 0],
        middle: Vec::new(),
        out_w: vec![0],
        out_thr: vec![u16::MAX],
        out_table: [row0, vec![u64::MAX; words]].concat(),
        read,
    };
    HashPredictorTable {
        model: "SmolLM2 (fixed set)".into(),
        dim: dim as u32,
        neurons: n as u32,
        input: PredictorInput::FfnInput,
        depth: 2,
        heads: 1,
        tau: 1,
        out_heads: 1,
        out_tau: 1,
        sparsity: 0.5,
        target_recall: 1.0,
        seed: 0,
        pca_dims: 1,
        layers: vec![net; img.layers()],
    }
}

/// A table reading the residual after the previous FFN that picks the first or the second
/// half of the neurons by the sign of the input against a pseudo-random +-1 plane per layer:
/// its guesses move with the input, so the stages of speculate-and-refine change them.
pub fn halves_table(img: &FlashImage) -> HashPredictorTable {
    let (dim, n) = (
        img.geometry(0).dim as usize,
        img.geometry(0).neurons as usize,
    );
    let mut t = fixed_hash_table(img, &|j| j < n / 2, (n / 2) as u32);
    t.input = PredictorInput::PrevFfnOutput;
    let words = n.div_ceil(64);
    let mut second = vec![0u64; words];
    for j in n / 2..n {
        second[j / 64] |= 1 << (j % 64);
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for net in t.layers.iter_mut() {
        net.proj = (0..dim)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if state & 1 == 1 {
                    1
                } else {
                    -1
                }
            })
            .collect();
        // The first table's row is all ones for a negative sign, all zeros otherwise; more than
        // 32 of its bits agree with the zero plane only in the second case.
        net.out_w = vec![0];
        net.out_thr = vec![32];
        net.out_table = [net.out_table[..words].to_vec(), second.clone()].concat();
    }
    t
}
