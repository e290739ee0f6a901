//! The flash image on SmolLM2-135M (skipped visibly when the model is absent): every neuron's
//! bundle reads back through the reader bit for bit as the engine's in-memory bundles hold it;
//! the dense part boots and, with the FFN read back from the blocks, decodes the GGUF's greedy
//! text; images of another model or board, truncated or damaged ones, are refused; greedy
//! placement reads no more blocks per token than identity on a trace.

mod common;

use leanstream::boot::{Arena, ArenaKind, Plan};
use leanstream::engine::{Arenas, Decoder, Engine, EngineOptions};
use leanstream::load::open_model;
use leanstream::model::flash::{model_identity, FlashImage, Part, PAGE};
use leanstream::model::ggml::{dequantize_row, GgmlType};
use leanstream::model::gguf::build::Builder;
use leanstream::model::ModelFile;
use leanstream::quant::view::Rows;
use leanstream::quant::Precision;
use leanstream::sparsity::bundle::{Bundles, Down};
use leanstream::sparsity::ThresholdTable;
use leanstream_tools::offline::flash::{write_image, BoardTarget, FlashOptions, BUNDLE_DOWN};
use leanstream_tools::offline::placement::{cost, Active, ActiveSets, Placement, PlacementKind};
use leanstream_tools::offline::trace::TraceReader;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A folder for one test, removed when the test ends (passed or not): images are 100 MiB.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(test: &str) -> TmpDir {
        let dir =
            std::env::temp_dir().join(format!("leanstream-flash-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TmpDir(dir)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn options(placement: PlacementKind, trace: Option<PathBuf>) -> FlashOptions {
    FlashOptions {
        board: BoardTarget::load("host").unwrap(),
        precision: Precision::Native,
        placement,
        thresholds: None,
        trace,
        eval_trace: None,
        active: Active::TopK { keep: 0.2 },
        block_units: 1,
        run_blocks: None,
    }
}

/// The repository's thresholds table for SmolLM2 (committed in tables/).
fn smollm2_table() -> PathBuf {
    common::repo_root().join("tables/SmolLM2-135M-Instruct.Q4_1.thresh")
}

fn image(dir: &TmpDir, model: &Path, name: &str) -> (PathBuf, FlashImage) {
    let out = dir.join(name);
    let mut o = options(PlacementKind::Identity, None);
    o.thresholds = Some(smollm2_table());
    write_image(model, &out, &o, &mut |_, _| {}).unwrap();
    let img = FlashImage::open(&out).unwrap();
    (out, img)
}

/// Row `i` of a block's part, alone.
fn one(p: Part<'_>, i: usize) -> Part<'_> {
    Part {
        data: &p.data[i * p.stride..],
        rows: 1,
        ..p
    }
}

fn same_rows(what: &str, n: usize, image: Rows, memory: Rows) {
    assert_eq!(image.ty, memory.ty, "{what} type, neuron {n}");
    assert_eq!(image.cols, memory.cols);
    assert!(
        image.row(0) == memory.row(n),
        "{what} of neuron {n} differs from the in-memory bundle"
    );
}

/// Every neuron's gate row, up row and down column, read through the reader, equals the
/// in-memory bundle's (bit for bit, same types); blocks are whole 4 KiB pages on 4 KiB
/// boundaries.
#[test]
fn bundles_read_back_bit_for_bit() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = TmpDir::new("bundles");
    let (_, img) = image(&dir, &model, "bundles.flash");
    img.verify().unwrap();
    let file = ModelFile::open(&model).unwrap();
    let h = file.hyper().unwrap();
    assert_eq!(img.layers(), h.n_layers);
    assert_eq!(
        img.header.model_identity,
        model_identity(file.gguf().unwrap())
    );
    // The thresholds table rides along, byte for byte, and decodes against the header's key.
    let table = std::fs::read(smollm2_table()).unwrap();
    assert_eq!(img.thresholds_bytes(), Some(&table[..]));
    let t: ThresholdTable = leanstream::tables::decode(
        img.thresholds_bytes().unwrap(),
        leanstream::sparsity::thresholds::KIND,
        leanstream::sparsity::thresholds::VERSION,
        img.header.tables_identity,
    )
    .unwrap();
    assert_eq!(t, ThresholdTable::load(&smollm2_table(), &file).unwrap());
    // SmolLM2 Q4_1 at width 576: 360 + 360 + 612 (Q8_0 column) bytes, 3 bundles a block.
    let g = img.geometry(0);
    assert_eq!((g.per_block, g.blocks, g.block_bytes), (3, 512, 4096));
    same_bundles(&img, &file, 0..h.n_layers);
}

/// Layers `layers` of the image hold, neuron by neuron, the bundles the engine builds from
/// `file`'s FFN tensors.
fn same_bundles(img: &FlashImage, file: &ModelFile, layers: std::ops::Range<usize>) {
    let h = file.hyper().unwrap();
    for l in layers {
        let t = |p: &str| file.tensor(&format!("blk.{l}.{p}.weight")).unwrap();
        let (gt, ut, dt) = (t("ffn_gate"), t("ffn_up"), t("ffn_down"));
        let mut plan = Plan::default();
        Bundles::plan(&mut plan, &gt, &ut, &dt, BUNDLE_DOWN).unwrap();
        let mut arena = Arena::map(ArenaKind::FfnCache, plan.bytes).unwrap();
        let mut c = arena.carver();
        let b = Bundles::build(&mut c, &gt, &ut, &dt, BUNDLE_DOWN).unwrap();
        let Down::Columns(down) = b.down else {
            panic!("columns")
        };
        for block in 0..img.blocks(l) {
            let (at, len) = img.block_extent(l, block);
            assert!(at % PAGE as u64 == 0 && len % PAGE == 0);
        }
        for n in 0..h.hidden_dim {
            let (block, i) = img.slot_of(l, n);
            assert_eq!(img.block_neurons(l, block)[i] as usize, n);
            let rows = img.block_rows(l, block);
            same_rows("gate row", n, one(rows.gate, i).into(), b.gate);
            same_rows("up row", n, one(rows.up, i).into(), b.up);
            same_rows("down column", n, one(rows.down, i).into(), down);
        }
    }
}

/// At w4a8 the image holds the bundles of the model `leanstream requant` makes at w4a8 (int4
/// gate and up in the middle layers, int8 in the first and last).
#[test]
fn w4a8_bundles_are_the_requantized_models() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = TmpDir::new("w4a8");
    let (m, rq) = (model.to_str().unwrap(), dir.join("w4a8.gguf"));
    let r = leanstream(&[
        "requant",
        m,
        "--precision",
        "w4a8",
        "--out",
        rq.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let out = dir.join("w4a8.flash");
    let mut o = options(PlacementKind::Identity, None);
    o.precision = Precision::W4a8;
    write_image(&model, &out, &o, &mut |_, _| {}).unwrap();
    let img = FlashImage::open(&out).unwrap();
    assert_eq!(img.header.precision, "w4a8");
    let requantized = ModelFile::open(&rq).unwrap();
    let last = img.layers() - 1;
    assert_eq!(img.geometry(1).types().unwrap().0, GgmlType::Q4_0);
    assert_eq!(img.geometry(last).types().unwrap().0, GgmlType::Q8_0);
    // The dense part holds requant's tensors, byte for byte.
    let dense = img.dense_model().unwrap();
    let g = dense.gguf().unwrap();
    assert!(g.tensors.len() > 100);
    for t in &g.tensors {
        let r = requantized.tensor(&t.name).unwrap();
        assert!(
            r.ty == t.ty && r.data == g.tensor_data(t),
            "{} differs from requant's",
            t.name
        );
    }
    same_bundles(&img, &requantized, 0..2);
    same_bundles(&img, &requantized, last..last + 1);
}

/// The dense part of the image, with the FFN tensors put back together from the image's
/// blocks: gate and up rows as they are (the model's bytes), down as f32 from the columns.
fn model_from_image(img: &FlashImage) -> ModelFile {
    let dense = img.dense_model().unwrap();
    let g = dense.gguf().unwrap();
    let mut b = Builder {
        kv: g
            .metadata()
            .iter()
            .map(|(k, v)| {
                let (ty, bytes) = v.encode();
                (k.clone(), ty, bytes)
            })
            .collect(),
        alignment: g.alignment,
        ..Builder::default()
    };
    for t in &g.tensors {
        assert!(!t.name.contains("ffn_gate") && !t.name.contains("ffn_up"));
        let dims: Vec<u64> = t.dims.iter().map(|&d| d as u64).collect();
        b.tensor(&t.name, &dims, t.ty, g.tensor_data(t).to_vec());
    }
    for l in 0..img.layers() {
        let geo = *img.geometry(l);
        let (n, dim) = (geo.neurons as usize, geo.dim as usize);
        let (gt, ut, _) = geo.types().unwrap();
        let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), vec![0f32; dim * n]);
        let mut col = vec![0f32; dim];
        for j in 0..n {
            let (block, i) = img.slot_of(l, j);
            let r = img.block_rows(l, block);
            gate.extend_from_slice(r.gate.row(i));
            up.extend_from_slice(r.up.row(i));
            dequantize_row(r.down.ty, r.down.row(i), &mut col);
            for (o, v) in col.iter().enumerate() {
                down[o * n + j] = *v;
            }
        }
        let name = |p: &str| format!("blk.{l}.{p}.weight");
        b.tensor(&name("ffn_gate"), &[dim as u64, n as u64], gt, gate);
        b.tensor(&name("ffn_up"), &[dim as u64, n as u64], ut, up);
        b.tensor_f32(&name("ffn_down"), &[n as u64, dim as u64], &down);
    }
    ModelFile::from_bytes(b.build()).unwrap()
}

fn greedy_tokens(file: &ModelFile, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = Engine::boot(&mut arenas, file, engine_options()).unwrap();
    let mut t = leanstream::engine::sample::argmax(e.prefill(prompt, 0));
    let mut out = vec![t];
    for pos in prompt.len()..prompt.len() + n - 1 {
        t = e.forward_greedy(t, pos);
        out.push(t);
    }
    out
}

fn engine_options() -> EngineOptions {
    EngineOptions {
        threads: 2,
        context: 64,
        ..Default::default()
    }
}

/// The logits after the prompt and after each of `tokens` but the last, fed in turn.
fn logits_along(file: &ModelFile, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut arenas = Arenas::from_board().unwrap();
    let mut e = Engine::boot(&mut arenas, file, engine_options()).unwrap();
    let mut out = vec![e.prefill(prompt, 0).to_vec()];
    for (i, &t) in tokens[..tokens.len() - 1].iter().enumerate() {
        out.push(e.forward(t, prompt.len() + i).to_vec());
    }
    out
}

/// The dense part is a GGUF the engine boots from (with the FFN read back from the blocks),
/// and it predicts the GGUF's greedy text. The rebuilt model's down matrix is f32 (the
/// GGUF's is quantized and multiplied on int8 activations), so the logits agree closely, not
/// bit for bit: fed the GGUF's text, the rebuilt model's logits are each within a small
/// distance, and each GGUF token is the rebuilt model's choice or a near-tie with it (greedy
/// texts compared whole diverged at one once attention's arithmetic changed).
#[test]
fn dense_part_boots_and_decodes_the_ggufs_text() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = TmpDir::new("boot");
    let (_, img) = image(&dir, &model, "boot.flash");
    let (file, tok) = open_model(&model, None).unwrap();
    // The dense part holds everything but the FFN: the tokenizer and chat template too.
    let dense = img.dense_model().unwrap();
    let dense_tok = leanstream::tokenizer::Tokenizer::from_gguf(dense.gguf().unwrap()).unwrap();
    let prompt = tok.encode("The capital of France is", false);
    assert_eq!(dense_tok.encode("The capital of France is", false), prompt);
    assert!(!dense.has_tensor("blk.0.ffn_down.weight"));
    let rebuilt = model_from_image(&img);
    let want = greedy_tokens(&file, &prompt, 12);
    let (a, b) = (
        logits_along(&file, &prompt, &want),
        logits_along(&rebuilt, &prompt, &want),
    );
    let argmax = leanstream::engine::sample::argmax;
    let (mut worst, mut agree) = (0f32, 0);
    for (step, ((a, b), &t)) in a.iter().zip(&b).zip(&want).enumerate() {
        assert_eq!(argmax(a), t, "step {step}: the GGUF's own greedy token");
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
        let top = b[argmax(b) as usize];
        assert!(
            top - b[t as usize] <= LOGIT_TOLERANCE,
            "step {step}: the GGUF's {:?} is {} below the rebuilt model's {:?}",
            tok.decode(&[t]),
            top - b[t as usize],
            tok.decode(&[argmax(b)])
        );
        agree += usize::from(argmax(b) == t);
    }
    println!(
        "GGUF {:?}: largest logit difference {worst}, the same greedy token at {agree} of {} steps",
        tok.decode(&want),
        want.len()
    );
    assert!(worst <= LOGIT_SPREAD, "logits {worst} apart");
    assert!(agree + 1 >= want.len(), "{agree} of {} tokens", want.len());
}

/// How far below the rebuilt model's top logit the GGUF's greedy token may be (a near-tie).
const LOGIT_TOLERANCE: f32 = 0.5;
/// How far any of the rebuilt model's logits may be from the GGUF's (SmolLM2's span tens of
/// units; 1.48 measured at 12 tokens over the 49,152 of each step).
const LOGIT_SPREAD: f32 = 2.5;

/// Another model's or board's image is refused in one sentence naming both; a truncated
/// file, a damaged header and a damaged block are refused with a clear error.
#[test]
fn refuses_other_models_boards_and_damage() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let dir = TmpDir::new("refuse");
    let (path, img) = image(&dir, &model, "refuse.flash");
    let file = ModelFile::open(&model).unwrap();
    let id = model_identity(file.gguf().unwrap());
    img.check_for(id, "SmolLM2", "host").unwrap();
    let e = img
        .check_for(id ^ 1, "Qwen2.5-0.5B", "host")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "this flash image was made for model '{}'",
            img.header.model_name
        )) && e.contains("not for 'Qwen2.5-0.5B'"),
        "{e}"
    );
    let e = img
        .check_for(id, "SmolLM2", "jetson-orin-nano-8gb")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("made for board 'host', not for board 'jetson-orin-nano-8gb'"),
        "{e}"
    );

    let bytes = std::fs::read(&path).unwrap();
    let open = |b: &[u8], name: &str| {
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        FlashImage::open(&p)
    };
    for cut in [0, 10, 3000, bytes.len() / 2, bytes.len() - 1] {
        let e = open(&bytes[..cut], "cut.flash").unwrap_err().to_string();
        assert!(e.contains("truncated"), "cut at {cut}: {e}");
    }
    let mut hdr = bytes.clone();
    hdr[40] ^= 0x04;
    let e = open(&hdr, "hdr.flash").unwrap_err().to_string();
    assert!(e.contains("header is damaged"), "{e}");
    let (at, _) = img.block_extent(7, 100);
    let mut blk = bytes.clone();
    blk[at as usize + 17] ^= 0x01;
    let damaged = open(&blk, "blk.flash").unwrap();
    let e = damaged.verify().unwrap_err().to_string();
    assert_eq!(
        e,
        "flash image is damaged: checksum mismatch in layer 7's FFN blocks"
    );
    let e = open(b"GGUF\x03\0\0\0 not an image", "gguf.flash")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a LeanStream flash image"), "{e}");
}

fn leanstream(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .current_dir(common::repo_root())
        .output()
        .unwrap()
}

/// On a short trace, `leanstream flash --placement greedy` writes a placement that reads no
/// more blocks per token than model order (over the trace's top-20% sets), and says both.
#[test]
fn greedy_placement_reads_fewer_blocks_than_identity() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let Some(wiki) = common::shared("data/wikitext-2/wiki.test.raw") else {
        return;
    };
    let (m, w) = (model.to_str().unwrap(), wiki.to_str().unwrap());
    let dir = TmpDir::new("greedy");
    let trace = dir.join("trace.safetensors");
    let t = trace.to_str().unwrap();
    let r = leanstream(&[
        "trace",
        "--model",
        m,
        "--file",
        w,
        "--tokens",
        "48",
        "--ctx",
        "48",
        "--sparsity",
        "0",
        "--stages",
        "1",
        "--threads",
        "2",
        "--out",
        t,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let out = dir.join("greedy.flash");
    let r = leanstream(&[
        "flash",
        m,
        "--board",
        "host",
        "--placement",
        "greedy",
        "--trace",
        t,
        "--active-sparsity",
        "0.8",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("identity") && err.contains("greedy") && err.contains("blocks/token"),
        "{err}"
    );
    let img = FlashImage::open(&out).unwrap();
    assert_eq!(img.header.placement, "greedy");
    let layers: Vec<Vec<u32>> = (0..img.layers())
        .map(|l| {
            (0..img.blocks(l))
                .flat_map(|b| img.block_neurons(l, b).to_vec())
                .collect()
        })
        .collect();
    let n = img.geometry(0).neurons as usize;
    let per_block: Vec<usize> = (0..img.layers())
        .map(|l| img.geometry(l).per_block as usize)
        .collect();
    let bytes: Vec<usize> = vec![PAGE; img.layers()];
    let active = ActiveSets::from_trace(
        &TraceReader::open(&trace).unwrap(),
        &Active::TopK { keep: 0.2 },
    )
    .unwrap();
    let greedy = cost(&Placement { layers }, &per_block, &bytes, 1, &active);
    let identity = cost(
        &Placement::identity(img.layers(), n),
        &per_block,
        &bytes,
        1,
        &active,
    );
    eprintln!("identity {identity:?}\ngreedy {greedy:?}");
    assert!(
        greedy.blocks_per_token <= identity.blocks_per_token,
        "greedy {greedy:?} identity {identity:?}"
    );
    assert!(greedy.bytes_per_useful_neuron <= identity.bytes_per_useful_neuron);
}

/// Bad requests are refused, naming what is wrong, and write nothing.
#[test]
fn cli_refusals() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let m = model.to_str().unwrap();
    let dir = TmpDir::new("refusals");
    let out = dir.join("never.flash");
    let o = out.to_str().unwrap();
    let r = leanstream(&["flash", m, "--board", "no-such-board", "--out", o]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success()
            && e.contains("no board-configs/no-such-board.toml")
            && e.contains("host"),
        "{e}"
    );
    let r = leanstream(&[
        "flash",
        m,
        "--board",
        "host",
        "--placement",
        "greedy",
        "--out",
        o,
    ]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && e.contains("--trace"), "{e}");
    assert!(!out.exists() && !dir.join("never.flash.partial").exists());
}
