//! SmolLM2-135M flashed for this host with its committed thresholds table (skipped visibly
//! when the model is absent): the image, the oracle's FFN options at sparsity 0.5 with dropped
//! means, and the helpers the streaming tests share (controller, replay).

use super::{model, repo_root, SMOLLM2};
use leanstream::engine::{Decoder, EngineOptions, StreamOptions};
use leanstream::model::ModelFile;
use leanstream::predict::PredictKind;
use leanstream::quant::Precision;
use leanstream::sparsity::{FfnMode, FfnOptions, Score, ThresholdTable};
use leanstream::stream::{CacheBudget, Policy};
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions, BUNDLE_DOWN};
use leanstream_tools::offline::placement::{Active, PlacementKind};
use std::path::{Path, PathBuf};

pub const TOKENS: &[u32] = &[1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 2683];

pub struct TmpDir(pub PathBuf);

impl TmpDir {
    pub fn new(test: &str) -> TmpDir {
        let dir = std::env::temp_dir().join(format!(
            "leanstream-smol-image-{}-{test}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TmpDir(dir)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Setup {
    pub dir: TmpDir,
    pub model: PathBuf,
    pub image: PathBuf,
    pub file: ModelFile,
    pub ffn: FfnOptions,
}

pub fn setup(test: &str) -> Option<Setup> {
    let model = model(SMOLLM2)?;
    let table_path = repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh");
    let dir = TmpDir::new(test);
    let image = dir.0.join("smol.flash");
    let o = FlashOptions {
        board: BoardTarget::load("host").unwrap(),
        precision: Precision::Native,
        placement: PlacementKind::Identity,
        thresholds: Some(table_path.clone()),
        trace: None,
        eval_trace: None,
        active: Active::TopK { keep: 0.2 },
        block_units: 1,
        run_blocks: None,
    };
    write_image(&model, &image, &o, &mut |_, _| {}).unwrap();
    let file = ModelFile::open(&model).unwrap();
    let table = ThresholdTable::load(&table_path, &file).unwrap();
    let ffn = FfnOptions {
        mode: FfnMode::Oracle,
        score: Score::Glu,
        sparsity: 0.5,
        thresholds: Some(table.thresholds(0.5, Score::Glu).unwrap()),
        bundle_down: BUNDLE_DOWN,
        dropped: Some(table.dropped_mean(0.5, Score::Glu).unwrap()),
    };
    Some(Setup {
        dir,
        model,
        image,
        file,
        ffn,
    })
}

pub fn stream(image: &Path, controller: Option<PathBuf>) -> StreamOptions {
    StreamOptions {
        image: image.to_path_buf(),
        budget: CacheBudget::Fraction(0.25),
        policy: Policy::Lfu,
        predict: PredictKind::Oracle,
        predictor: None,
        eviction: None,
        refine_stages: None,
        controller,
        hot: Vec::new(),
        faults: Vec::new(),
        shuffle: None,
        replay: None,
        merge_blocks: None,
    }
}

pub fn opts(ffn: FfnOptions, stream: Option<StreamOptions>) -> EngineOptions {
    EngineOptions {
        threads: 2,
        context: 64,
        ffn,
        stream,
        ..Default::default()
    }
}

pub fn logits(e: &mut dyn Decoder, tokens: &[u32]) -> Vec<Vec<f32>> {
    tokens
        .iter()
        .enumerate()
        .map(|(p, &t)| {
            let l = e.forward(t, p).to_vec();
            assert!(e.take_error().is_none(), "token {p} failed");
            l
        })
        .collect()
}

pub fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len());
    for (t, (x, y)) in a.iter().zip(b).enumerate() {
        let diff = x
            .iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        assert_eq!(diff, 0, "{what}: token {t}: {diff} logits differ");
    }
}
