//! The streaming options shared by `leanstream` (generate, perplexity, bench) and `leanstreamd`:
//! they apply when the model given is a flash image (`--model IMAGE` or `--image IMAGE`).

use super::StreamOptions;
use crate::predict::PredictKind;
use crate::stream::{CacheBudget, Policy};
use clap::Args;
use std::path::Path;

#[derive(Args, Clone, Debug)]
pub struct StreamArgs {
    /// With a flash image: the weight cache, as a share of the image's FFN (25%, 0.25) or bytes
    /// (512MiB), within the board's ffn_cache budget.
    #[arg(long, default_value = "25%", value_name = "SIZE")]
    pub ffn_budget: String,
    /// With a flash image: the cache policy: lru, lfu, or hot (the image's profiled hot blocks
    /// pinned, the rest LFU).
    #[arg(long, default_value = "lru", value_name = "POLICY")]
    pub cache: String,
    /// With a flash image: which blocks are read: oracle (the thresholds' neurons) or stale (the
    /// previous token's blocks).
    #[arg(long, default_value = "oracle", value_name = "KIND")]
    pub predict: String,
}

impl StreamArgs {
    /// The engine's streaming options for `image`.
    pub fn options(&self, image: &Path) -> Result<StreamOptions, String> {
        let budget: CacheBudget = self.ffn_budget.parse()?;
        let policy: Policy = self.cache.parse()?;
        let predict = PredictKind::parse(&self.predict).map_err(|e| e.to_string())?;
        Ok(StreamOptions {
            image: image.to_path_buf(),
            budget,
            policy,
            predict,
            hot: Vec::new(),
            faults: Vec::new(),
            shuffle: None,
        })
    }
}
