//! The streaming options shared by `leanstream` (generate, perplexity, bench) and `leanstreamd`:
//! they apply when the model given is a flash image (`--model IMAGE` or `--image IMAGE`).

use crate::predict::PredictKind;
use crate::stream::cache::CacheStats;
use crate::stream::fault::Fault;
use crate::stream::BlockId;
use crate::stream::{CacheBudget, Policy};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Clone, Debug)]
pub struct StreamArgs {
    /// With a flash image: the weight cache, as a share of the image's FFN (25%, 0.25) or bytes
    /// (512MiB), within the board's ffn_cache budget.
    #[arg(long, default_value = "25%", value_name = "SIZE")]
    pub ffn_budget: String,
    /// With a flash image: the cache policy: lru, lfu, or hot (the image's profiled hot blocks
    /// pinned, the rest LFU). Default: lru; hot with --predict powerinfer2.
    #[arg(long, value_name = "POLICY")]
    pub cache: Option<String>,
    /// With a flash image: which blocks are read: oracle (the thresholds' neurons), stale (the
    /// previous token's blocks), or a table from train-predictor (--predictor): hash, dejavu,
    /// dejavu-stale, bnn, powerinfer2 (dejavu's table with --cache hot).
    #[arg(long, default_value = "oracle", value_name = "KIND")]
    pub predict: String,
    /// With --cache learned: the reuse-distance table (leanstream train-eviction).
    #[arg(long, value_name = "FILE")]
    pub eviction: Option<PathBuf>,
    /// The predictor table for --predict hash, dejavu, dejavu-stale, bnn, powerinfer2
    /// (leanstream train-predictor).
    #[arg(long, value_name = "FILE")]
    pub predictor: Option<PathBuf>,
    /// Speculate-and-refine, with a table trained with --input prev-ffn-output: the next
    /// layer's reads are queued while this layer runs and re-ranked after each of K stages of
    /// its FFN (1: once, when the FFN is done; 0: no look-ahead). Default: 1 with such a table.
    #[arg(long, value_name = "K")]
    pub refine_stages: Option<usize>,
    /// The streaming controller's LUT (`leanstream controller solve`): per layer, the plan
    /// (lanes, queue depth, compute share, prefetch depth) for the layer's remaining load.
    /// Default: the board's maxima for every layer.
    #[arg(long, value_name = "LUT")]
    pub controller: Option<PathBuf>,
    /// Adjacent blocks one disk read may cover, 1 to the board's io.queue_depth (1: a read a
    /// block). Default: the board's io.merge_blocks.
    #[arg(long, value_name = "N")]
    pub merge_blocks: Option<usize>,
}

impl StreamArgs {
    /// The engine's streaming options for `image`.
    pub fn options(&self, image: &Path) -> Result<StreamOptions, String> {
        let budget: CacheBudget = self.ffn_budget.parse()?;
        let predict = PredictKind::parse(&self.predict).map_err(|e| e.to_string())?;
        let policy: Policy = match (&self.cache, predict) {
            (None, PredictKind::PowerInfer2) => Policy::Hot,
            (None, _) => Policy::Lru,
            (Some(c), _) => c.parse()?,
        };
        if predict == PredictKind::PowerInfer2 && policy != Policy::Hot {
            return Err(format!(
                "--predict powerinfer2 pins hot neurons: it runs with --cache hot, not --cache {policy}"
            ));
        }
        match (policy, &self.eviction) {
            (Policy::Learned, None) => return Err(
                "--cache learned needs --eviction FILE (a table from leanstream train-eviction)"
                    .into(),
            ),
            (p, Some(_)) if p != Policy::Learned => {
                return Err(format!(
                    "--eviction is read by --cache learned, not by --cache {p}"
                ))
            }
            _ => {}
        }
        match (predict.needs_table(), &self.predictor) {
            (true, None) => {
                return Err(format!(
                    "--predict {} needs --predictor FILE (a table from leanstream train-predictor)",
                    predict.name()
                ))
            }
            (false, Some(_)) => {
                return Err(format!(
                    "--predictor is read by the learned predictors, not by --predict {}",
                    predict.name()
                ))
            }
            _ => {}
        }
        if self.refine_stages.is_some() && !predict.needs_table() {
            return Err(format!(
                "--refine-stages re-ranks the reads a predictor table guesses (--predict hash, dejavu, ...), not --predict {}'s",
                predict.name()
            ));
        }
        Ok(StreamOptions {
            image: image.to_path_buf(),
            budget,
            policy,
            predict,
            predictor: self.predictor.clone(),
            eviction: self.eviction.clone(),
            refine_stages: self.refine_stages,
            controller: self.controller.clone(),
            hot: Vec::new(),
            faults: Vec::new(),
            shuffle: None,
            replay: None,
            merge_blocks: self.merge_blocks,
        })
    }
}

/// How the FFN is streamed (`--image`, `--ffn-budget`, `--cache`, `--predict`).
#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// The flash image (`leanstream flash`) the lanes read FFN blocks from.
    pub image: PathBuf,
    /// The weight cache's size: a share of the image's FFN bytes, or bytes.
    pub budget: CacheBudget,
    pub policy: Policy,
    pub predict: PredictKind,
    /// The learned predictors' table (`leanstream train-predictor`).
    pub predictor: Option<PathBuf>,
    /// The `learned` cache policy's reuse-distance table (`leanstream train-eviction`).
    pub eviction: Option<PathBuf>,
    /// Speculate-and-refine's stages K (`--refine-stages`; None: 1 with a table reading
    /// prev-ffn-output, else 0).
    pub refine_stages: Option<usize>,
    /// The controller's LUT (`control::Lut`); None: the board's maxima.
    pub controller: Option<PathBuf>,
    /// Blocks the `hot` policy pins (global ids); empty: the image's most frequently used
    /// blocks (its profile, written by `leanstream flash --trace`), as many as half the slots
    /// while a whole layer still fits beside them.
    pub hot: Vec<BlockId>,
    /// Tests: reads go through a fault-injecting backend with these faults (block ids are
    /// global: layer `l`'s block `b` is `StreamedFfn::block_id(l, b)`), in a shuffled order
    /// when a seed is given.
    pub faults: Vec<Fault>,
    pub shuffle: Option<u64>,
    /// Benchmarks: each layer-step's blocks (global ids) as a real model's decode asked for
    /// them over an image of this geometry (`stream-bench --record-sets`), asked for again in
    /// the same order, step after step, instead of predicting: the values come from the real
    /// model, the reads, cache and compute are this run's (`gpu-decode-bench`).
    pub replay: Option<std::sync::Arc<Vec<Vec<BlockId>>>>,
    /// Adjacent blocks one read may cover (`--merge-blocks`); None: the board's
    /// `io.merge_blocks`.
    pub merge_blocks: Option<usize>,
}

/// What the streamed FFN has done since boot (or the last `StreamedFfn::reset_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamStats {
    pub cache: CacheStats,
    /// Tokens decoded.
    pub tokens: u64,
    /// Time the decode thread waited for reads.
    pub io_wait_ns: u64,
    /// Neurons the sparse FFN chose, and those left out because their block was not read
    /// (`stale`) or failed.
    pub chosen: u64,
    pub missed: u64,
    /// Reads queued ahead of their layer (speculate-and-refine).
    pub ahead: u64,
}

impl StreamStats {
    pub fn bytes_per_token(&self) -> f64 {
        self.cache.bytes_read as f64 / self.tokens.max(1) as f64
    }
    pub fn io_wait_ms_per_token(&self) -> f64 {
        self.io_wait_ns as f64 / 1e6 / self.tokens.max(1) as f64
    }
    pub fn hit_ratio(&self) -> f64 {
        1.0 - self.cache.miss_ratio()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(predict: &str, predictor: Option<&str>) -> StreamArgs {
        StreamArgs {
            ffn_budget: "25%".into(),
            cache: None,
            predict: predict.into(),
            predictor: predictor.map(PathBuf::from),
            eviction: None,
            refine_stages: None,
            controller: None,
            merge_blocks: None,
        }
    }

    #[test]
    fn refine_stages_go_with_a_table() {
        let img = Path::new("m.flash");
        let mut a = args("oracle", None);
        a.refine_stages = Some(2);
        let e = a.options(img).unwrap_err();
        assert_eq!(
            e,
            "--refine-stages re-ranks the reads a predictor table guesses (--predict hash, dejavu, ...), not --predict oracle's"
        );
        let mut a = args("hash", Some("t.hashpred"));
        a.refine_stages = Some(2);
        assert_eq!(a.options(img).unwrap().refine_stages, Some(2));
    }

    #[test]
    fn hash_needs_a_table_and_only_hash_reads_one() {
        let img = Path::new("m.flash");
        let e = args("hash", None).options(img).unwrap_err();
        assert!(e.contains("--predict hash needs --predictor FILE"), "{e}");
        let e = args("stale", Some("t.hashpred")).options(img).unwrap_err();
        assert_eq!(
            e,
            "--predictor is read by the learned predictors, not by --predict stale"
        );
        let o = args("powerinfer2", Some("t.mlppred")).options(img).unwrap();
        assert_eq!(o.policy, Policy::Hot, "powerinfer2 pins hot neurons");
        let mut a = args("powerinfer2", Some("t.mlppred"));
        a.cache = Some("lru".into());
        let e = a.options(img).unwrap_err();
        assert!(e.contains("runs with --cache hot, not --cache lru"), "{e}");
        assert_eq!(
            args("oracle", None).options(img).unwrap().policy,
            Policy::Lru
        );
        let mut a = args("oracle", None);
        a.cache = Some("learned".into());
        let e = a.options(img).unwrap_err();
        assert!(e.contains("--cache learned needs --eviction FILE"), "{e}");
        a.eviction = Some("t.reuse".into());
        assert_eq!(a.options(img).unwrap().policy, Policy::Learned);
        a.cache = Some("lfu".into());
        let e = a.options(img).unwrap_err();
        assert_eq!(
            e,
            "--eviction is read by --cache learned, not by --cache lfu"
        );
        let o = args("hash", Some("t.hashpred")).options(img).unwrap();
        assert_eq!(o.predict, PredictKind::Hash);
        assert_eq!(o.predictor.as_deref(), Some(Path::new("t.hashpred")));
    }
}
