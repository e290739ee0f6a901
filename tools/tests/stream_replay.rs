//! Replayed block sets (`StreamOptions::replay`, what `gpu-decode-bench` runs on the GPU
//! machine over same-shape weights): a decode that replays the oracle's recorded sets asks
//! for exactly those blocks, layer-step by layer-step, and, its neurons kept at the same
//! thresholds, gives the oracle's logits bit for bit (SmolLM2-135M; skipped visibly when
//! absent). A replay that runs out starts from its first token again.

mod common;

use common::smol_image::{logits, opts, same_bits, setup, stream, TOKENS};
use leanstream::engine::{Arenas, Engine};
use std::sync::Arc;

#[test]
fn a_replay_of_the_oracles_sets_reads_them_and_gives_its_logits() {
    let Some(s) = setup("replay") else {
        return;
    };
    let dense = leanstream::model::flash::FlashImage::open(&s.image)
        .unwrap()
        .dense_model()
        .unwrap();
    // The oracle's decode, its sets recorded.
    let (want, sets) = {
        let mut arenas = Arenas::from_board().unwrap();
        let so = stream(&s.image, None);
        let mut e = Engine::boot(&mut arenas, &dense, opts(s.ffn.clone(), Some(so))).unwrap();
        e.stream_mut().unwrap().set_recording(true);
        let l = logits(&mut e, TOKENS);
        (l, e.stream_mut().unwrap().take_recorded())
    };
    let layers = dense.hyper().unwrap().n_layers;
    assert_eq!(sets.len(), TOKENS.len() * layers);

    // The replay: the same sets asked for, the same logits.
    let mut arenas = Arenas::from_board().unwrap();
    let mut so = stream(&s.image, None);
    so.replay = Some(Arc::new(sets.clone()));
    let mut e = Engine::boot(&mut arenas, &dense, opts(s.ffn.clone(), Some(so))).unwrap();
    e.stream_mut().unwrap().set_recording(true);
    same_bits(&logits(&mut e, TOKENS), &want, "replayed oracle sets");
    assert_eq!(e.stream_mut().unwrap().take_recorded(), sets);

    // Past its end it starts again: the first two tokens' sets once more.
    e.stream_mut().unwrap().reset_sequence();
    let again = logits(&mut e, &TOKENS[..2]);
    same_bits(&again, &want[..2], "the replay from its start again");
    assert_eq!(
        e.stream_mut().unwrap().take_recorded(),
        sets[..2 * layers].to_vec()
    );
}
