//! Choosing the next token from the logits: greedy, or temperature with top-k and top-p, from a
//! seeded generator. Works in a sort buffer handed out at boot, so it allocates nothing.

use std::fmt;

/// How to sample. `temperature == 0` is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1.0 keeps all.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Refuses values no sampler can honour, naming the field.
    pub fn check(&self) -> Result<(), SamplerError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplerError::Temperature(self.temperature));
        }
        if !self.top_p.is_finite() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return Err(SamplerError::TopP(self.top_p));
        }
        Ok(())
    }
}

/// A sampler setting no sampler can honour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerError {
    /// Negative or not finite.
    Temperature(f32),
    /// Outside (0, 1].
    TopP(f32),
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SamplerError::Temperature(t) => {
                write!(f, "temperature must be a finite number >= 0, got {t}")
            }
            SamplerError::TopP(p) => write!(f, "top_p must be in (0, 1], got {p}"),
        }
    }
}

impl std::error::Error for SamplerError {}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<SamplerError> for String {
    fn from(e: SamplerError) -> String {
        e.to_string()
    }
}

/// A small, fast, seedable generator (xorshift64*): the same seed gives the same tokens.
#[derive(Clone, Copy, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Mix the seed so 0 and nearby seeds start far apart; the state must be non-zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

pub struct Sampler<'a> {
    pub config: SamplerConfig,
    rng: Rng,
    idx: &'a mut [u32],
}

/// Index of the largest value (the first, on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

impl<'a> Sampler<'a> {
    /// `idx` needs one entry per vocabulary token.
    pub fn new(config: SamplerConfig, idx: &'a mut [u32]) -> Sampler<'a> {
        Sampler {
            config,
            rng: Rng::new(config.seed),
            idx,
        }
    }

    /// Starts a new request's sequence of draws.
    pub fn reset(&mut self, config: SamplerConfig) {
        self.config = config;
        self.rng = Rng::new(config.seed);
    }

    /// Whether `sample` is plain argmax (so a backend may pick the token itself).
    pub fn is_greedy(&self) -> bool {
        self.config.temperature == 0.0 || self.config.top_k == 1
    }

    /// Picks the next token; may overwrite `logits`.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        let c = self.config;
        if self.is_greedy() {
            return argmax(logits);
        }
        let n = logits.len();
        let idx = &mut self.idx[..n];
        for (i, v) in idx.iter_mut().enumerate() {
            *v = i as u32;
        }
        // Candidates: top-k first (a partial selection), then sorted by logit.
        let mut m = n;
        if c.top_k > 0 && c.top_k < n {
            idx.select_nth_unstable_by(c.top_k - 1, |&a, &b| {
                logits[b as usize].total_cmp(&logits[a as usize])
            });
            m = c.top_k;
        }
        let cand = &mut idx[..m];
        cand.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        // Softmax over the candidates at the temperature.
        let max = logits[cand[0] as usize];
        let mut sum = 0.0f32;
        for &i in cand.iter() {
            let p = ((logits[i as usize] - max) / c.temperature).exp();
            logits[i as usize] = p;
            sum += p;
        }
        // Top-p: the shortest prefix whose mass reaches p.
        let mut keep = m;
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (j, &i) in cand.iter().enumerate() {
                acc += logits[i as usize] / sum;
                if acc >= c.top_p {
                    keep = j + 1;
                    break;
                }
            }
        }
        let kept = &cand[..keep];
        let mass: f32 = kept.iter().map(|&i| logits[i as usize]).sum();
        let r = self.rng.next_f32() * mass;
        let mut acc = 0.0;
        for &i in kept {
            acc += logits[i as usize];
            if r < acc {
                return i;
            }
        }
        kept[keep - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(t: f32, k: usize, p: f32, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature: t,
            top_k: k,
            top_p: p,
            seed,
        }
    }

    #[test]
    fn greedy_takes_the_largest() {
        let mut idx = [0u32; 5];
        let mut s = Sampler::new(SamplerConfig::default(), &mut idx);
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 2.9, 0.0]), 1);
    }

    #[test]
    fn same_seed_same_draws_and_top_k_limits() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect();
        let mut idx = vec![0u32; 100];
        let mut draw = |seed| {
            let mut s = Sampler::new(cfg(1.0, 3, 1.0, seed), &mut idx);
            (0..50)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        let mut top3: Vec<u32> = (0..100u32).collect();
        top3.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        for t in &a {
            assert!(top3[..3].contains(t), "{t} outside the top 3");
        }
        assert!(
            a.iter().any(|&t| t != a[0]),
            "temperature 1 over 3 close candidates should vary"
        );
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // One token holds almost all the mass: top_p 0.5 must always pick it.
        let mut idx = vec![0u32; 4];
        let mut s = Sampler::new(cfg(1.0, 0, 0.5, 3), &mut idx);
        for _ in 0..100 {
            assert_eq!(s.sample(&mut [0.0, 10.0, 0.0, 0.0]), 1);
        }
    }

    #[test]
    fn temperature_spreads_draws_in_proportion() {
        let mut idx = vec![0u32; 2];
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 11), &mut idx);
        // p(1) = e^1 / (1 + e^1) = 0.731
        let ones = (0..4000).filter(|_| s.sample(&mut [0.0, 1.0]) == 1).count();
        let frac = ones as f64 / 4000.0;
        assert!((frac - 0.731).abs() < 0.03, "{frac}");
    }

    #[test]
    fn bad_configs_are_refused() {
        assert_eq!(
            cfg(-1.0, 0, 1.0, 0).check(),
            Err(SamplerError::Temperature(-1.0))
        );
        assert!(matches!(
            cfg(f32::NAN, 0, 1.0, 0).check(),
            Err(SamplerError::Temperature(_))
        ));
        assert_eq!(cfg(1.0, 0, 0.0, 0).check(), Err(SamplerError::TopP(0.0)));
        assert_eq!(cfg(1.0, 0, 1.5, 0).check(), Err(SamplerError::TopP(1.5)));
        assert!(cfg(0.7, 40, 0.9, 0).check().is_ok());
    }
}
