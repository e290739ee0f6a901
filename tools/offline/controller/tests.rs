use super::*;

fn plan(lanes: u16) -> StreamPlan {
    StreamPlan {
        lanes,
        queue_depth: 8,
        compute_percent: 100,
        prefetch: 1,
        freq: None,
    }
}

/// A tiny deterministic pseudo-random stream (no dependency).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// A profile of `layers` layers and `plans` plans whose R lies in `states` clearly separated
/// bands (state q: R near q * 1000), with random costs and successors: every (layer, state,
/// plan) is profiled.
fn random_profile(layers: usize, states: usize, plans: usize, seed: u64) -> Profile {
    let mut rng = Lcg(seed);
    let mut p = Profile {
        board: "host".into(),
        model_id: 1,
        layers,
        plans: (0..plans).map(|i| plan(i as u16 + 1)).collect(),
        steps: Vec::new(),
        runs: Vec::new(),
    };
    for n in 0..layers {
        for q in 0..states {
            for ph in 0..plans {
                for _ in 0..3 {
                    p.steps.push(ProfiledStep {
                        layer: n as u16,
                        remaining_bytes: q as u64 * 1000 + rng.next() % 100,
                        plan: ph as u16,
                        io_ns: 1_000_000 + rng.next() % 9_000_000,
                        compute_ns: 1_000_000 + rng.next() % 3_000_000,
                        bytes_read: rng.next() % 1_000_000,
                        workers: 1 + (rng.next() % 2) as u16,
                        next_remaining: Some((rng.next() % states as u64) * 1000 + 7),
                    });
                }
            }
        }
    }
    p
}

/// The expected cost of following `policy[k][q]` (step k, state q) for `h` steps from layer
/// `n` in state `q`.
fn policy_cost(m: &Model, policy: &[Vec<usize>], k: usize, h: usize, n: usize, q: usize) -> f64 {
    if k == h {
        return 0.0;
    }
    let p = policy[k][q];
    let c = m.cell(n, q, p);
    c.cost
        + (0..m.states)
            .filter(|&q2| c.next[q2] > 0.0)
            .map(|q2| c.next[q2] * policy_cost(m, policy, k + 1, h, (n + 1) % m.layers, q2))
            .sum::<f64>()
}

#[test]
fn backward_recursion_equals_brute_force_over_every_policy() {
    for seed in 1..=6 {
        let (layers, states, plans, h) = (2, 2, 2, 3);
        let profile = random_profile(layers, states, plans, seed);
        let m = Model::from_profile(&profile, states, CostModel::default()).unwrap();
        // The quantile edges found the bands.
        for e in &m.edges {
            assert!(e[0] >= 1000 && e[0] < 1100, "{e:?}");
        }
        let (v, act) = backward_recursion(&m, h);
        // Every time-varying deterministic policy: plans^(h * states) of them.
        let count = plans.pow((h * states) as u32);
        for n in 0..layers {
            for q in 0..states {
                let mut best = f64::INFINITY;
                let mut best_first = Vec::new();
                for code in 0..count {
                    let policy: Vec<Vec<usize>> = (0..h)
                        .map(|k| {
                            (0..states)
                                .map(|s| (code / plans.pow((k * states + s) as u32)) % plans)
                                .collect()
                        })
                        .collect();
                    let c = policy_cost(&m, &policy, 0, h, n, q);
                    if c < best - 1e-12 {
                        best = c;
                        best_first = vec![policy[0][q]];
                    } else if (c - best).abs() <= 1e-12 {
                        best_first.push(policy[0][q]);
                    }
                }
                assert!(
                    (v[n][q] - best).abs() < 1e-9,
                    "seed {seed} layer {n} state {q}: recursion {} brute force {best}",
                    v[n][q]
                );
                let a = act[n][q].expect("every cell profiled");
                assert!(best_first.contains(&a), "seed {seed}: {a} not optimal");
            }
        }
        // And the LUT holds those first actions, with the model's edges.
        let lut = solve("host", &profile.plans, &m, h, 0.0, 0).unwrap();
        for (n, row) in act.iter().enumerate() {
            for (q, &a) in row.iter().enumerate() {
                assert_eq!(Some(lut.entry(n, q)), a);
            }
            assert_eq!(lut.edges(n), &m.edges[n][..]);
        }
    }
}

#[test]
fn the_model_averages_costs_and_counts_successors() {
    let mut p = random_profile(1, 1, 1, 3);
    p.steps.clear();
    let step = |r, io, next| ProfiledStep {
        layer: 0,
        remaining_bytes: r,
        plan: 0,
        io_ns: io,
        compute_ns: 1_000_000,
        bytes_read: 400_000_000,
        workers: 2,
        next_remaining: next,
    };
    // Two states split at the median R (edge 600): R 0 and 500 in state 0, 600 and 700 in 1.
    p.steps = vec![
        step(0, 1_000_000, Some(900)),
        step(500, 3_000_000, Some(0)),
        step(600, 5_000_000, Some(900)),
        step(700, 7_000_000, None),
    ];
    let cost = CostModel {
        energy_weight: 0.5,
        ..CostModel::default()
    };
    let m = Model::from_profile(&p, 2, cost).unwrap();
    assert_eq!(m.edges, vec![vec![600]]);
    let c0 = m.cell(0, 0, 0);
    assert_eq!(c0.samples, 2);
    // Mean latency 3 ms, plus 0.5 x (2 W x 2 workers x 1 ms + 2.5 nJ x 400 MB = 1.004 J).
    assert!(
        (c0.cost - (0.003 + 0.5 * 1.004)).abs() < 1e-12,
        "{}",
        c0.cost
    );
    assert!((c0.energy - 1.004).abs() < 1e-12);
    assert_eq!(c0.next, vec![0.5, 0.5]);
    let c1 = m.cell(0, 1, 0);
    assert_eq!(c1.samples, 2);
    assert!((c1.io_s - 0.006).abs() < 1e-12);
    // The last step has no successor: only 600 -> 900 counts.
    assert_eq!(c1.next, vec![0.0, 1.0]);
}

#[test]
fn unprofiled_states_take_the_nearest_profiled_plan_and_the_best_static_is_the_fastest() {
    let mut p = random_profile(2, 1, 2, 9);
    // Plan 1 is much cheaper everywhere, and every R is 50: the edges are [50, 50], so
    // states 0 and 1 are never seen and take state 2's plan.
    for s in p.steps.iter_mut() {
        s.remaining_bytes = 50;
        s.next_remaining = Some(50);
        if s.plan == 1 {
            s.io_ns /= 100;
        }
    }
    let m = Model::from_profile(&p, 3, CostModel::default()).unwrap();
    let lut = solve("host", &p.plans, &m, 2, 0.0, 0).unwrap();
    for n in 0..2 {
        for q in 0..3 {
            assert_eq!(lut.entry(n, q), 1, "layer {n} state {q}");
        }
    }
    p.add_run(0, &[], 10, 2.0);
    p.add_run(1, &[], 10, 1.0);
    p.add_run(1, &[], 10, 1.5);
    assert_eq!(p.best_static(), Some((1, 8.0)));
    assert!(Model::from_profile(&p, 0, CostModel::default()).is_err());
}
