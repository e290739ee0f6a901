//! The controller's offline half (LeanStream paper 3.2.3, eq. 3-8; DESIGN.md section 7 (e)):
//! a profile of the streamed FFN per (layer, state, plan), and the finite-horizon stochastic
//! problem solved by backward recursion into `LUT[layer][state]`.
//!
//! - A [`Profile`] holds one [`ProfiledStep`] per layer-step the profiler ran: the layer, its
//!   remaining load R, the plan, T^I (I/O wait), T^II (the rest), bytes read, workers, and R of
//!   the layer-step that followed (layer n + 1 of the same token, or layer 0 of the next).
//! - States: per layer, `states - 1` byte edges at the quantiles of the R seen at that layer
//!   (all plans pooled), so each state is about equally likely.
//! - Cost of a step: T^I + T^II (seconds) + `energy_weight` x the energy proxy (joules):
//!   `core_watts` x workers x T^II + `joules_per_byte` x bytes read. The paper minimizes
//!   latency alone: `energy_weight` 0 is the default.
//! - The model: per (layer, state, plan) the mean cost and the empirical distribution of the next
//!   state (paper eq. 5-6); a (layer, state, plan) never profiled is not a choice there.
//! - Eq. 7: V^0 = 0, V^h_n(q) = min_phi [c_n(q, phi) + sum_q' P_n(q' | q, phi) V^(h-1)_(n+1)(q')],
//!   layer n + 1 after the last being layer 0 of the next token; `LUT[n][q]` is the argmin at
//!   h = H. A state never seen at a layer takes the plan of the nearest state seen there.

use leanstream::control::{LayerSample, Lut, LutError, StreamPlan, MAX_STATES};
use serde::{Deserialize, Serialize};

/// One profiled layer-step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfiledStep {
    pub layer: u16,
    pub remaining_bytes: u64,
    pub plan: u16,
    pub io_ns: u64,
    pub compute_ns: u64,
    pub bytes_read: u64,
    pub workers: u16,
    /// R of the next layer-step in the same run (None for a run's last step).
    pub next_remaining: Option<u64>,
}

/// Decode speed of one plan over a profiled run (the best static plan is searched on these).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanRun {
    pub plan: u16,
    pub tokens: u64,
    pub seconds: f64,
}

/// What `leanstream controller profile` writes (JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub board: String,
    /// The image's tables identity (the LUT's model identity).
    pub model_id: u64,
    pub layers: usize,
    pub plans: Vec<StreamPlan>,
    pub steps: Vec<ProfiledStep>,
    pub runs: Vec<PlanRun>,
}

impl Profile {
    /// Appends one run's samples (consecutive layer-steps) under plan `plan`.
    pub fn add_run(&mut self, plan: u16, samples: &[LayerSample], tokens: u64, seconds: f64) {
        for (i, s) in samples.iter().enumerate() {
            self.steps.push(ProfiledStep {
                layer: s.layer,
                remaining_bytes: s.remaining_bytes,
                plan,
                io_ns: s.io_ns,
                compute_ns: s.compute_ns,
                bytes_read: s.bytes_read,
                workers: s.workers,
                next_remaining: samples.get(i + 1).map(|n| n.remaining_bytes),
            });
        }
        self.runs.push(PlanRun {
            plan,
            tokens,
            seconds,
        });
    }

    /// The plan of the highest decode speed over its runs (the best static plan), and it.
    pub fn best_static(&self) -> Option<(usize, f64)> {
        (0..self.plans.len())
            .filter_map(|p| {
                let (t, s) = self
                    .runs
                    .iter()
                    .filter(|r| r.plan as usize == p)
                    .fold((0u64, 0f64), |(t, s), r| (t + r.tokens, s + r.seconds));
                (t > 0 && s > 0.0).then(|| (p, t as f64 / s))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// The energy proxy's constants and its weight in the cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    pub energy_weight: f64,
    pub core_watts: f64,
    pub joules_per_byte: f64,
}

impl Default for CostModel {
    fn default() -> CostModel {
        // An A78-class core busy at ~2 W; an NVMe read at ~5 W for ~2 GB/s: 2.5 nJ a byte.
        CostModel {
            energy_weight: 0.0,
            core_watts: 2.0,
            joules_per_byte: 2.5e-9,
        }
    }
}

impl CostModel {
    pub fn energy(&self, s: &ProfiledStep) -> f64 {
        self.core_watts * s.workers as f64 * s.compute_ns as f64 * 1e-9
            + self.joules_per_byte * s.bytes_read as f64
    }

    pub fn cost(&self, s: &ProfiledStep) -> f64 {
        (s.io_ns + s.compute_ns) as f64 * 1e-9 + self.energy_weight * self.energy(s)
    }
}

/// The finite MDP the profile induces: per (layer, state, plan) the mean cost, T^I, T^II and
/// the next state's distribution.
#[derive(Clone, Debug)]
pub struct Model {
    pub layers: usize,
    pub states: usize,
    pub plans: usize,
    /// Per layer, `states - 1` byte edges.
    pub edges: Vec<Vec<u64>>,
    /// Index `(n * states + q) * plans + p`.
    pub cells: Vec<Cell>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cell {
    pub samples: usize,
    pub cost: f64,
    pub io_s: f64,
    pub compute_s: f64,
    pub energy: f64,
    /// Probability of each next state (sums to 1 when `samples` > 0).
    pub next: Vec<f64>,
}

fn state_of(edges: &[u64], r: u64) -> usize {
    edges.iter().take_while(|&&e| e <= r).count()
}

impl Model {
    /// The model of `profile` with `states` states per layer.
    pub fn from_profile(
        profile: &Profile,
        states: usize,
        cost: CostModel,
    ) -> Result<Model, String> {
        if states == 0 || states > MAX_STATES {
            return Err(format!("{states} states: 1 to {MAX_STATES}"));
        }
        let (layers, plans) = (profile.layers, profile.plans.len());
        if layers == 0 || plans == 0 {
            return Err("the profile has no layers or no plans".into());
        }
        let mut edges = Vec::with_capacity(layers);
        for n in 0..layers {
            let mut r: Vec<u64> = profile
                .steps
                .iter()
                .filter(|s| s.layer as usize == n)
                .map(|s| s.remaining_bytes)
                .collect();
            if r.is_empty() {
                return Err(format!("the profile has no step of layer {n}"));
            }
            r.sort_unstable();
            edges.push(
                (1..states)
                    .map(|k| r[k * r.len() / states])
                    .collect::<Vec<_>>(),
            );
        }
        let mut cells = vec![
            Cell {
                next: vec![0.0; states],
                ..Cell::default()
            };
            layers * states * plans
        ];
        // Next-state counts: steps with a successor; the rest fall back to every step of the
        // next layer under the same plan (below).
        let mut with_next = vec![0usize; cells.len()];
        for s in &profile.steps {
            let (n, p) = (s.layer as usize, s.plan as usize);
            if n >= layers || p >= plans {
                return Err(format!(
                    "a step names layer {n} or plan {p} outside the profile"
                ));
            }
            let q = state_of(&edges[n], s.remaining_bytes);
            let c = &mut cells[(n * states + q) * plans + p];
            c.samples += 1;
            c.cost += cost.cost(s);
            c.io_s += s.io_ns as f64 * 1e-9;
            c.compute_s += s.compute_ns as f64 * 1e-9;
            c.energy += cost.energy(s);
            if let Some(r) = s.next_remaining {
                let next_layer = (n + 1) % layers;
                c.next[state_of(&edges[next_layer], r)] += 1.0;
                with_next[(n * states + q) * plans + p] += 1;
            }
        }
        for n in 0..layers {
            for q in 0..states {
                for p in 0..plans {
                    let i = (n * states + q) * plans + p;
                    let k = cells[i].samples;
                    if k == 0 {
                        continue;
                    }
                    let c = &mut cells[i];
                    c.cost /= k as f64;
                    c.io_s /= k as f64;
                    c.compute_s /= k as f64;
                    c.energy /= k as f64;
                    if with_next[i] == 0 {
                        // No successor recorded: the next layer's states under this plan.
                        let nl = (n + 1) % layers;
                        for s in profile
                            .steps
                            .iter()
                            .filter(|s| s.layer as usize == nl && s.plan as usize == p)
                        {
                            c.next[state_of(&edges[nl], s.remaining_bytes)] += 1.0;
                        }
                    }
                    let total: f64 = c.next.iter().sum();
                    if total > 0.0 {
                        c.next.iter_mut().for_each(|v| *v /= total);
                    }
                }
            }
        }
        Ok(Model {
            layers,
            states,
            plans,
            edges,
            cells,
        })
    }

    pub fn cell(&self, n: usize, q: usize, p: usize) -> &Cell {
        &self.cells[(n * self.states + q) * self.plans + p]
    }

    fn feasible(&self, n: usize, q: usize, p: usize) -> bool {
        self.cell(n, q, p).samples > 0
    }
}

/// Eq. 7 over `horizon` layer-steps: `(V^H, argmin)` per layer and state; a state with no
/// profiled plan has V = +inf and no action.
pub fn backward_recursion(m: &Model, horizon: usize) -> (Vec<Vec<f64>>, Vec<Vec<Option<usize>>>) {
    let (layers, states) = (m.layers, m.states);
    let mut v = vec![vec![0.0f64; states]; layers];
    let mut act = vec![vec![None; states]; layers];
    for _ in 0..horizon {
        let mut nv = vec![vec![f64::INFINITY; states]; layers];
        for n in 0..layers {
            let next = &v[(n + 1) % layers];
            for q in 0..states {
                let mut best: Option<(usize, f64)> = None;
                for p in (0..m.plans).filter(|&p| m.feasible(n, q, p)) {
                    let c = m.cell(n, q, p);
                    let future: f64 = c
                        .next
                        .iter()
                        .zip(next)
                        .filter(|(pr, _)| **pr > 0.0)
                        .map(|(pr, vn)| pr * vn)
                        .sum();
                    let total = c.cost + future;
                    if best.is_none_or(|(_, b)| total < b) {
                        best = Some((p, total));
                    }
                }
                if let Some((p, total)) = best {
                    nv[n][q] = total;
                    act[n][q] = Some(p);
                }
            }
        }
        v = nv;
    }
    (v, act)
}

/// Solves `model` over `horizon` layer-steps into the LUT (`fallback`: the plan of a layer none
/// of whose states was profiled, which `from_profile` does not produce).
pub fn solve(
    board: &str,
    plans: &[StreamPlan],
    model: &Model,
    horizon: usize,
    energy_weight: f64,
    fallback: usize,
) -> Result<Lut, LutError> {
    let (_, act) = backward_recursion(model, horizon.max(1));
    let entries: Vec<Vec<u16>> = act
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|q| {
                    // The nearest profiled state's plan (lower states first on a tie).
                    (0..row.len())
                        .filter_map(|d| row[d].map(|p| (q.abs_diff(d), d, p)))
                        .min()
                        .map_or(fallback, |(_, _, p)| p) as u16
                })
                .collect()
        })
        .collect();
    Lut::new(
        board,
        plans.to_vec(),
        &model.edges,
        &entries,
        horizon,
        energy_weight as f32,
    )
}

#[cfg(test)]
#[path = "controller/tests.rs"]
mod tests;
