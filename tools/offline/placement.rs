//! Neuron placement for the flash image (LeanStream paper 3.2.2, item 1): which neurons share a
//! block. A [`Placement`] is one permutation per layer (slot -> neuron; slot s is entry s % k of
//! block s / k), so every way of choosing one plugs in the same: `identity` (model order),
//! `greedy` (pairwise co-activation bundling from a trace) here, the paper's learned embeddings
//! later.
//!
//! [`cost`] is the measure they are compared by, over per-token active sets ([`ActiveSets`]:
//! top-k, or at or over a threshold, of |SiLU(gate) * up| from a trace): the blocks a token
//! reads, and the bytes read per neuron it needed (a block brings its other neurons too).

use super::trace::TraceReader;

/// Which placement `leanstream flash` makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementKind {
    Identity,
    Greedy,
    /// Learned co-activation embeddings, clustered (`offline::coact`, the paper's way).
    Coact,
}

impl PlacementKind {
    pub fn parse(s: &str) -> Result<PlacementKind, String> {
        match s {
            "identity" => Ok(PlacementKind::Identity),
            "greedy" => Ok(PlacementKind::Greedy),
            "coact" => Ok(PlacementKind::Coact),
            _ => Err(format!(
                "unknown placement '{s}': expected identity, greedy or coact"
            )),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            PlacementKind::Identity => "identity",
            PlacementKind::Greedy => "greedy",
            PlacementKind::Coact => "coact",
        }
    }
}

/// Per layer, the neuron in each slot.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub layers: Vec<Vec<u32>>,
}

impl Placement {
    /// Neurons in model order.
    pub fn identity(layers: usize, neurons: usize) -> Placement {
        Placement {
            layers: vec![(0..neurons as u32).collect(); layers],
        }
    }
}

/// The learned co-activation placement (`offline::coact`, default settings) of every layer,
/// in blocks of `per_block[l]` neurons, the blocks chained for reads of up to `run` adjacent
/// blocks (`offline::coact::chain`; 1 keeps the clustering's order, hottest first).
pub fn coact(active: &ActiveSets, per_block: &[usize], run: usize) -> Placement {
    let settings = super::coact::Settings::default();
    Placement {
        layers: active
            .sets
            .iter()
            .zip(per_block)
            .map(|(sets, &k)| {
                super::coact::placement(sets, active.neurons, k.max(1), run, &settings)
            })
            .collect(),
    }
}

/// Per layer and token, the neurons a token needed (sorted).
#[derive(Clone, Debug)]
pub struct ActiveSets {
    pub neurons: usize,
    /// [layer][token] -> neurons.
    pub sets: Vec<Vec<Vec<u32>>>,
}

/// Which neurons count as active in a trace.
#[derive(Clone, Debug)]
pub enum Active {
    /// The `keep` fraction with the largest |SiLU(gate) * up|, per token and layer.
    TopK { keep: f32 },
    /// |SiLU(gate) * up| at or over the layer's threshold (the oracle's rule).
    Threshold(Vec<f32>),
}

impl ActiveSets {
    /// The active sets of every token of a trace (its `neuron_act`).
    pub fn from_trace(t: &TraceReader, rule: &Active) -> Result<ActiveSets, String> {
        let act = t.tensor("neuron_act")?;
        let (n, layers) = (t.hidden, t.layers);
        if act.len() != t.tokens * layers * n {
            return Err(format!(
                "trace neuron_act holds {} values, not {} tokens x {layers} layers x {n}",
                act.len(),
                t.tokens
            ));
        }
        if let Active::Threshold(th) = rule {
            if th.len() != layers {
                return Err(format!(
                    "{} thresholds for a trace of {layers} layers",
                    th.len()
                ));
            }
        }
        let mut sets = vec![Vec::with_capacity(t.tokens); layers];
        let mut order: Vec<u32> = Vec::with_capacity(n);
        for tok in 0..t.tokens {
            for (l, per_layer) in sets.iter_mut().enumerate() {
                let row = &act[(tok * layers + l) * n..][..n];
                let mut set: Vec<u32> = match rule {
                    Active::Threshold(th) => (0..n as u32)
                        .filter(|&j| row[j as usize].abs() >= th[l])
                        .collect(),
                    Active::TopK { keep } => {
                        let k = ((*keep as f64 * n as f64).round() as usize).min(n);
                        order.clear();
                        order.extend(0..n as u32);
                        if k < n {
                            order.select_nth_unstable_by(k, |&a, &b| {
                                row[b as usize].abs().total_cmp(&row[a as usize].abs())
                            });
                        }
                        order[..k].to_vec()
                    }
                };
                set.sort_unstable();
                per_layer.push(set);
            }
        }
        Ok(ActiveSets { neurons: n, sets })
    }

    pub fn tokens(&self) -> usize {
        self.sets.first().map_or(0, Vec::len)
    }
}

/// What a placement costs over some active sets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Blocks read per token, summed over the layers.
    pub blocks_per_token: f64,
    /// Bytes read per neuron the token needed (blocks x their bytes / active neurons).
    pub bytes_per_useful_neuron: f64,
    /// Neurons needed per token, summed over the layers.
    pub useful_per_token: f64,
    /// Reads per token, summed over the layers, when up to `run` adjacent blocks go in one
    /// read (the lanes' merged reads).
    pub reads_per_token: f64,
    /// The `run` those reads were counted at.
    pub run: usize,
}

/// The cost of `placement` with `per_block` neurons a block of `block_bytes` (per layer), with
/// every block a token needs read once (no cache: the placement's own figure), in reads of up
/// to `run` adjacent blocks.
pub fn cost(
    placement: &Placement,
    per_block: &[usize],
    block_bytes: &[usize],
    run: usize,
    active: &ActiveSets,
) -> Cost {
    let (mut blocks, mut bytes, mut useful, mut reads) = (0u64, 0u64, 0u64, 0u64);
    let mut seen: Vec<u32> = Vec::new();
    let mut touched: Vec<usize> = Vec::new();
    for (l, sets) in active.sets.iter().enumerate() {
        let k = per_block[l].max(1);
        let mut block_of = vec![0u32; active.neurons];
        for (slot, &n) in placement.layers[l].iter().enumerate() {
            block_of[n as usize] = (slot / k) as u32;
        }
        seen.clear();
        seen.resize(active.neurons.div_ceil(k), u32::MAX);
        for (t, set) in sets.iter().enumerate() {
            touched.clear();
            for &n in set {
                let b = block_of[n as usize] as usize;
                if seen[b] != t as u32 {
                    seen[b] = t as u32;
                    touched.push(b);
                }
            }
            blocks += touched.len() as u64;
            bytes += touched.len() as u64 * block_bytes[l] as u64;
            useful += set.len() as u64;
            reads += super::coact::reads(&mut touched, run) as u64;
        }
    }
    let tokens = active.tokens().max(1) as f64;
    Cost {
        blocks_per_token: blocks as f64 / tokens,
        bytes_per_useful_neuron: bytes as f64 / useful.max(1) as f64,
        useful_per_token: useful as f64 / tokens,
        reads_per_token: reads as f64 / tokens,
        run: run.max(1),
    }
}

/// Co-active partners kept per neuron when ranking pairs (the rest hardly ever win a slot).
const PARTNERS: usize = 16;

/// Greedy pairwise co-activation bundling, per layer: count how often each pair of neurons is
/// active for the same token; take the pairs from most to least co-active and merge their
/// groups while the merged group fits a block (`per_block[l]` neurons); then fill blocks with
/// the groups left, largest first, and neurons never merged by how often they fire (hot
/// neurons share blocks). With one neuron a block there is nothing to bundle: identity.
pub fn greedy(active: &ActiveSets, per_block: &[usize]) -> Placement {
    let n = active.neurons;
    let mut counts = vec![
        0u32;
        if per_block.iter().any(|&k| k > 1) {
            n * n
        } else {
            0
        }
    ];
    let layers = active
        .sets
        .iter()
        .enumerate()
        .map(|(l, sets)| {
            let k = per_block[l].max(1);
            if k == 1 {
                return (0..n as u32).collect();
            }
            counts.fill(0);
            let mut freq = vec![0u32; n];
            for set in sets {
                for (i, &a) in set.iter().enumerate() {
                    freq[a as usize] += 1;
                    let row = &mut counts[a as usize * n..][..n];
                    for &b in &set[i + 1..] {
                        row[b as usize] += 1;
                    }
                }
            }
            // Each neuron's strongest partners (pairs stored once, a < b).
            let mut pairs: Vec<(u32, u32, u32)> = Vec::new();
            let mut best: Vec<(u32, u32)> = Vec::with_capacity(n);
            for a in 0..n {
                best.clear();
                for b in 0..n {
                    let c = if a < b {
                        counts[a * n + b]
                    } else {
                        counts[b * n + a]
                    };
                    if b != a && c > 0 {
                        best.push((c, b as u32));
                    }
                }
                let m = PARTNERS.min(best.len());
                if m < best.len() {
                    best.select_nth_unstable_by(m, |x, y| y.cmp(x));
                }
                for &(c, b) in &best[..m] {
                    if (a as u32) < b {
                        pairs.push((c, a as u32, b));
                    } else {
                        pairs.push((c, b, a as u32));
                    }
                }
            }
            pairs.sort_unstable_by(|x, y| y.0.cmp(&x.0).then((x.1, x.2).cmp(&(y.1, y.2))));
            pairs.dedup();
            group(n, k, &pairs, &freq)
        })
        .collect();
    Placement { layers }
}

/// Merges groups along `pairs` (most co-active first) while they fit `k`, then packs the
/// groups into blocks of `k`: the placement of one layer.
fn group(n: usize, k: usize, pairs: &[(u32, u32, u32)], freq: &[u32]) -> Vec<u32> {
    // Union-find with the members of each root.
    let mut root: Vec<u32> = (0..n as u32).collect();
    let mut members: Vec<Vec<u32>> = (0..n as u32).map(|j| vec![j]).collect();
    fn find(root: &mut [u32], mut j: u32) -> u32 {
        while root[j as usize] != j {
            root[j as usize] = root[root[j as usize] as usize];
            j = root[j as usize];
        }
        j
    }
    for &(_, a, b) in pairs {
        let (ra, rb) = (find(&mut root, a), find(&mut root, b));
        if ra == rb || members[ra as usize].len() + members[rb as usize].len() > k {
            continue;
        }
        let moved = std::mem::take(&mut members[rb as usize]);
        members[ra as usize].extend(moved);
        root[rb as usize] = ra;
    }
    // Groups, largest first; among equals the hottest first.
    let heat = |g: &Vec<u32>| g.iter().map(|&j| freq[j as usize] as u64).sum::<u64>();
    let mut groups: Vec<Vec<u32>> = members.into_iter().filter(|g| !g.is_empty()).collect();
    groups.sort_by(|a, b| b.len().cmp(&a.len()).then(heat(b).cmp(&heat(a))));
    // First fit: blocks open with room, a group goes to the first it fits in whole.
    let mut blocks: Vec<Vec<u32>> = Vec::new();
    for g in groups {
        match blocks.iter_mut().find(|b| b.len() + g.len() <= k) {
            Some(b) => b.extend(g),
            None => blocks.push(g),
        }
    }
    blocks.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens whose active neurons come in planted triples spread over the model order, so
    /// identity order splits every triple over three blocks.
    fn planted(n: usize, tokens: usize) -> ActiveSets {
        let groups = n / 3;
        let mut sets = Vec::new();
        let mut s = 12345u64;
        for _ in 0..tokens {
            let mut set = Vec::new();
            for g in 0..groups {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if (s >> 33).is_multiple_of(5) {
                    // Triple g is neurons g, g + groups, g + 2 groups.
                    set.extend([g, g + groups, g + 2 * groups].map(|j| j as u32));
                }
            }
            set.sort_unstable();
            sets.push(set);
        }
        ActiveSets {
            neurons: n,
            sets: vec![sets],
        }
    }

    #[test]
    fn greedy_finds_planted_groups_and_reads_fewer_blocks() {
        let active = planted(96, 200);
        let id = Placement::identity(1, 96);
        let g = greedy(&active, &[3]);
        let mut sorted = g.layers[0].clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..96).collect::<Vec<u32>>(), "a permutation");
        let (ci, cg) = (
            cost(&id, &[3], &[4096], 1, &active),
            cost(&g, &[3], &[4096], 1, &active),
        );
        // Every planted triple lands in one block: one block per three neurons needed, where
        // model order spreads each triple over three blocks (shared with other triples').
        assert!(
            (cg.blocks_per_token * 3.0 - cg.useful_per_token).abs() < 1e-9,
            "{cg:?}"
        );
        assert!(ci.blocks_per_token > 2.0 * cg.blocks_per_token, "{ci:?}");
        assert!(cg.bytes_per_useful_neuron < ci.bytes_per_useful_neuron);
        assert_eq!(cg.useful_per_token, ci.useful_per_token);
        for b in g.layers[0].chunks(3) {
            let g0 = b[0] % 32;
            assert!(b.iter().all(|&j| j % 32 == g0), "block {b:?}");
        }
    }

    #[test]
    fn cost_counts_blocks_and_bytes() {
        // 6 neurons, 2 a block of 100 bytes; token 0 needs 0 and 1 (one block), token 1 needs
        // 1 and 2 (two blocks).
        let active = ActiveSets {
            neurons: 6,
            sets: vec![vec![vec![0, 1], vec![1, 2]]],
        };
        let c = cost(&Placement::identity(1, 6), &[2], &[100], 1, &active);
        assert_eq!(c.blocks_per_token, 1.5);
        assert_eq!(c.reads_per_token, 1.5);
        // Blocks 0 and 1 are neighbours: one read of two at a run of 2.
        let merged = cost(&Placement::identity(1, 6), &[2], &[100], 2, &active);
        assert_eq!((merged.reads_per_token, merged.run), (1.0, 2));
        assert_eq!(c.bytes_per_useful_neuron, 300.0 / 4.0);
        assert_eq!(c.useful_per_token, 2.0);
        // One neuron a block: greedy is identity.
        assert_eq!(greedy(&active, &[1]), Placement::identity(1, 6));
    }
}
