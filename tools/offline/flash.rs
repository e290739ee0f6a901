//! `leanstream flash`: a GGUF written as a flash image (the format and its reader:
//! `leanstream::model::flash`), for a board, at a precision, with a placement.
//!
//! The dense part is a GGUF of every metadata key and every tensor but the FFN's, each in the
//! precision's GGML type (as `leanstream requant` writes them; `native` copies them). Each
//! layer's FFN is cut into neuron bundles exactly as the engine's in-memory bundles hold them
//! (`leanstream::sparsity::Bundles` with `BundleDown::AtLeast8Bit`: gate and up rows in the
//! model's (or precision's) type, down columns in `down_column_type`'s): the writer builds those
//! bundles for each layer and copies each neuron's three rows into its slot, so the image's
//! bytes are the engine's, bit for bit.
//!
//! The board (`board-configs/<name>.toml`, read here, so an image for any board can be written
//! on any machine) must hold the dense part in its `dense_weights` budget and, in `ffn_cache`,
//! at least one layer's worth of blocks: the least cache that lets a layer's FFN run whole.

use super::placement::{coact, cost, greedy, Active, ActiveSets, Cost, Placement, PlacementKind};
use super::trace::TraceReader;
use leanstream::boot::{Arena, ArenaKind, Plan};
use leanstream::engine::{Engine, EngineOptions};
use leanstream::model::flash::{
    encode_header, model_identity, Checksum, Header, LayerGeometry, Section, SectionKind, PAGE,
};
use leanstream::model::ggml::GgmlType;
use leanstream::model::gguf::build;
use leanstream::model::{ModelFile, TensorRef};
use leanstream::quant::{convert_to_ggml, target, Packing, Precision, Role, Target};
use leanstream::sparsity::bundle::{down_column_type, Bundles, Down};
use leanstream::sparsity::BundleDown;
use std::borrow::Cow;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

#[path = "../../firmware/board/config.rs"]
#[allow(dead_code)]
mod board_config;

/// How the bundles hold down columns: rows of a GGML type (not the in-memory default's tiles,
/// whose scales span 32 neurons and so cannot be split into blocks of k).
pub const BUNDLE_DOWN: BundleDown = BundleDown::AtLeast8Bit;

/// What `flash` needs of a board: its name, the two budgets it checks and the read unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoardTarget {
    pub name: String,
    pub dense_weights: u64,
    pub ffn_cache: u64,
    /// Bytes a block is a whole number of: 4 KiB, or the board's `block_align` when larger.
    pub read_unit: usize,
    /// Adjacent blocks its lanes read as one (`io.merge_blocks`): what `coact` chains blocks for.
    pub merge_blocks: usize,
}

impl BoardTarget {
    /// `board-configs/<name>.toml`, found in the working directory, the repository the binary
    /// was built in, or the source tree.
    pub fn load(name: &str) -> Result<BoardTarget, String> {
        let dirs = board_dirs();
        let Some(path) = dirs
            .iter()
            .map(|d| d.join(format!("{name}.toml")))
            .find(|p| p.is_file())
        else {
            let mut known: Vec<String> = dirs
                .iter()
                .filter_map(|d| std::fs::read_dir(d).ok())
                .flatten()
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_suffix(".toml").map(str::to_string)
                })
                .collect();
            known.sort();
            known.dedup();
            return Err(format!(
                "--board {name}: no board-configs/{name}.toml (boards: {})",
                known.join(", ")
            ));
        };
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v = board_config::parse_board(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let budget = |field: &str| {
            v.budgets
                .iter()
                .find(|(n, _)| *n == field)
                .map(|b| b.1)
                .expect("validated boards have every budget")
        };
        Ok(BoardTarget {
            name: v.name.clone(),
            dense_weights: budget("dense_weights"),
            ffn_cache: budget("ffn_cache"),
            read_unit: (v.io_block_align as usize).max(PAGE).next_multiple_of(PAGE),
            merge_blocks: v.io_merge_blocks as usize,
        })
    }
}

fn board_dirs() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from("board-configs")];
    if let Some(repo) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent()?.parent().map(Path::to_path_buf))
    {
        v.push(repo.join("board-configs"));
    }
    v.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../board-configs"));
    v.retain(|d| d.is_dir());
    v
}

/// Refuses a board that cannot hold the dense part plus the minimum cache, naming the field.
pub fn check_board(b: &BoardTarget, dense: u64, min_cache: u64) -> Result<(), String> {
    let mib = |x: u64| format!("{:.1} MiB", x as f64 / 1048576.0);
    if dense > b.dense_weights {
        return Err(format!(
            "board {} cannot hold this model: [budget] dense_weights is {}, the dense part needs {}",
            b.name,
            mib(b.dense_weights),
            mib(dense)
        ));
    }
    if min_cache > b.ffn_cache {
        return Err(format!(
            "board {} cannot hold this model: [budget] ffn_cache is {}, the minimum cache (one layer's blocks) needs {}",
            b.name,
            mib(b.ffn_cache),
            mib(min_cache)
        ));
    }
    Ok(())
}

/// What `flash` is asked for.
#[derive(Clone, Debug)]
pub struct FlashOptions {
    pub board: BoardTarget,
    pub precision: Precision,
    pub placement: PlacementKind,
    pub thresholds: Option<PathBuf>,
    /// A trace (`leanstream trace`) to place by and measure on.
    pub trace: Option<PathBuf>,
    /// A trace of other text to measure the placement on instead (held out from placing).
    pub eval_trace: Option<PathBuf>,
    /// Which neurons of the trace count as active.
    pub active: Active,
    /// Read units per block (1: as many bundles as fill one read unit). Larger blocks hold
    /// more bundles: fewer, larger reads, and room for placement to group co-active neurons
    /// where one bundle nearly fills a read unit.
    pub block_units: usize,
    /// `coact` only: chain its blocks so co-active ones sit side by side for reads of this
    /// many adjacent blocks (`offline::coact::chain`). None keeps the clustering's order
    /// (hottest first), which read fewer times on the real models measured (docs/STREAMING.md).
    pub run_blocks: Option<usize>,
}

/// What `flash` wrote.
#[derive(Clone, Debug)]
pub struct FlashReport {
    pub header: Header,
    pub file_bytes: u64,
    pub dense_bytes: u64,
    /// The dense weights arena the engine needs for the dense part (`Engine::plan`).
    pub dense_arena: u64,
    pub ffn_bytes: u64,
    pub min_cache: u64,
    /// On the evaluation trace, else the placing trace, when one was given: identity's cost and
    /// the written placement's.
    pub costs: Option<(Cost, Cost)>,
}

fn is_ffn(name: &str) -> bool {
    name.starts_with("blk.")
        && (name.ends_with(".ffn_gate.weight")
            || name.ends_with(".ffn_up.weight")
            || name.ends_with(".ffn_down.weight"))
}

/// A tensor in the precision's GGML type (`requant`'s conversion; `native` keeps every one).
fn in_precision<'a>(
    precision: Precision,
    name: &str,
    dims: usize,
    t: TensorRef<'a>,
    n_layers: usize,
    scratch: &mut Vec<f32>,
) -> (GgmlType, Cow<'a, [u8]>) {
    let matrix = dims >= 2 && t.ty.row_bytes(t.cols).is_some();
    if precision == Precision::Native || !matrix {
        return (t.ty, Cow::Borrowed(t.data));
    }
    let tg = target(
        precision,
        Packing::default(),
        Role::of(name, n_layers),
        t.ty,
        t.cols,
    );
    if tg == Target::Keep {
        return (t.ty, Cow::Borrowed(t.data));
    }
    let (ty, bytes, _) = convert_to_ggml(tg, &t, scratch);
    (ty, Cow::Owned(bytes))
}

/// Where the output is written before it is renamed into place.
fn partial_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Writes the flash image of the GGUF `model` to `out` (through `out.partial`, renamed once
/// whole and read back). `progress(done, total)` counts layers written.
pub fn write_image(
    model: &Path,
    out: &Path,
    o: &FlashOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FlashReport, String> {
    if matches!((model.canonicalize(), out.canonicalize()), (Ok(a), Ok(b)) if a == b) {
        return Err(format!(
            "{}: the output would overwrite the input; give another --out",
            out.display()
        ));
    }
    let file = ModelFile::open(model).map_err(|e| format!("{}: {e}", model.display()))?;
    let Some(g) = file.gguf() else {
        return Err(format!(
            "{}: flash reads GGUF files (the image's dense part is one); llama.cpp's convert script makes one from a checkpoint",
            model.display()
        ));
    };
    let h = file
        .hyper()
        .and_then(|h| file.validate(&h).map(|_| h))
        .map_err(|e| format!("{}: {e}", model.display()))?;
    let precision = o.precision;
    let dense_arena = Engine::plan(
        &file,
        &EngineOptions {
            precision,
            ..EngineOptions::default()
        },
    )
    .map_err(|e| format!("{}: {e}", model.display()))?
    .parts()[0]
        .1 as u64;

    // Each layer's geometry, from the types its rows will have.
    let mut scratch = Vec::new();
    let tensor = |name: &str| {
        file.tensor(name)
            .map_err(|e| format!("{}: {e}", model.display()))
    };
    let layer_ffn = |l: usize, scratch: &mut Vec<f32>| -> Result<LayerParts, String> {
        let mut parts = Vec::new();
        for part in ["ffn_gate", "ffn_up", "ffn_down"] {
            let name = format!("blk.{l}.{part}.weight");
            let t = tensor(&name)?;
            let (ty, bytes) = in_precision(precision, &name, 2, t, h.n_layers, scratch);
            parts.push((ty, bytes, t));
        }
        let [g, u, d]: [_; 3] = parts
            .try_into()
            .unwrap_or_else(|_| unreachable!("three parts"));
        Ok([g, u, d])
    };
    let part_type = |l: usize, part: &str| -> Result<GgmlType, String> {
        let name = format!("blk.{l}.{part}.weight");
        let t = tensor(&name)?;
        if precision == Precision::Native {
            return Ok(t.ty);
        }
        Ok(
            match target(
                precision,
                Packing::default(),
                Role::of(&name, h.n_layers),
                t.ty,
                t.cols,
            ) {
                Target::Keep => t.ty,
                Target::F16 => GgmlType::F16,
                Target::Q(leanstream::quant::QFormat::W8) => GgmlType::Q8_0,
                Target::Q(_) => GgmlType::Q4_0,
            },
        )
    };
    let mut geometry = Vec::with_capacity(h.n_layers);
    for l in 0..h.n_layers {
        let (gt, ut, dt) = (
            part_type(l, "ffn_gate")?,
            part_type(l, "ffn_up")?,
            part_type(l, "ffn_down")?,
        );
        let dty = down_column_type(dt, h.dim, BUNDLE_DOWN);
        geometry.push(
            LayerGeometry::new(
                h.hidden_dim,
                h.dim,
                gt,
                ut,
                dty,
                o.board.read_unit,
                o.block_units,
            )
            .ok_or_else(|| {
                format!(
                    "layer {l}: rows of {} values are not whole blocks of {}, {} and {}",
                    h.dim,
                    gt.name(),
                    ut.name(),
                    dty.name()
                )
            })?,
        );
    }
    let min_cache = geometry
        .iter()
        .map(|g| g.blocks as u64 * g.block_bytes as u64)
        .max()
        .unwrap_or(0);
    check_board(&o.board, dense_arena, min_cache)?;

    // The placement, and its cost on the trace.
    let per_block: Vec<usize> = geometry.iter().map(|g| g.per_block as usize).collect();
    // Reads are counted as the board's lanes make them: up to `merge_blocks` adjacent blocks
    // in one.
    let merge = o.board.merge_blocks.max(1);
    let block_bytes: Vec<usize> = geometry.iter().map(|g| g.block_bytes as usize).collect();
    let active_sets = |p: &Path| -> Result<ActiveSets, String> {
        let t = TraceReader::open(p)?;
        if (t.layers, t.hidden, t.dim) != (h.n_layers, h.hidden_dim, h.dim) {
            return Err(format!(
                "{}: a trace of {} layers of {} neurons (width {}), the model has {} of {} (width {})",
                p.display(),
                t.layers,
                t.hidden,
                t.dim,
                h.n_layers,
                h.hidden_dim,
                h.dim
            ));
        }
        ActiveSets::from_trace(&t, &o.active)
    };
    let active = o.trace.as_deref().map(active_sets).transpose()?;
    let eval = o.eval_trace.as_deref().map(active_sets).transpose()?;
    let placement = match (o.placement, &active) {
        (PlacementKind::Identity, _) => Placement::identity(h.n_layers, h.hidden_dim),
        (PlacementKind::Greedy, Some(a)) => greedy(a, &per_block),
        (PlacementKind::Coact, Some(a)) => coact(a, &per_block, o.run_blocks.unwrap_or(1)),
        (kind, None) => {
            return Err(format!(
            "--placement {} places by co-activation: give a trace with --trace (leanstream trace)",
            kind.name()
        ))
        }
    };
    let costs = eval.as_ref().or(active.as_ref()).map(|a| {
        (
            cost(
                &Placement::identity(h.n_layers, h.hidden_dim),
                &per_block,
                &block_bytes,
                merge,
                a,
            ),
            cost(&placement, &per_block, &block_bytes, merge, a),
        )
    });

    // How often each block was used on the profiling trace (the hot cache policy's profile).
    let frequency: Option<Vec<u8>> = active.as_ref().map(|a| {
        let mut out = Vec::new();
        for (l, sets) in a.sets.iter().enumerate() {
            let k = per_block[l];
            let mut block_of = vec![0u32; h.hidden_dim];
            for (slot, &n) in placement.layers[l].iter().enumerate() {
                block_of[n as usize] = (slot / k) as u32;
            }
            let mut count = vec![0u32; geometry[l].blocks as usize];
            let mut seen = vec![u32::MAX; count.len()];
            for (t, set) in sets.iter().enumerate() {
                for &n in set {
                    let b = block_of[n as usize] as usize;
                    if seen[b] != t as u32 {
                        seen[b] = t as u32;
                        count[b] += 1;
                    }
                }
            }
            out.extend(count.iter().flat_map(|c| c.to_le_bytes()));
        }
        out
    });

    // The thresholds table, checked against the model, kept as its file.
    let thresholds = match &o.thresholds {
        Some(p) => {
            leanstream::sparsity::ThresholdTable::load(p, &file)?;
            Some(std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        None => None,
    };

    // The dense part.
    let kv = g
        .metadata()
        .iter()
        .map(|(k, v)| {
            let (ty, b) = v.encode();
            (k.clone(), ty, b)
        })
        .collect();
    let mut tensors = Vec::new();
    for info in g.tensors.iter().filter(|t| !is_ffn(&t.name)) {
        let t = tensor(&info.name)?;
        let (ty, bytes) = in_precision(
            precision,
            &info.name,
            info.dims.len(),
            t,
            h.n_layers,
            &mut scratch,
        );
        let dims = info.dims.iter().map(|&d| d as u64).collect();
        tensors.push((info.name.clone(), dims, ty as u32, bytes.into_owned()));
    }
    let dense = build::Builder {
        kv,
        tensors,
        alignment: g.alignment,
        version: 3,
    }
    .build();

    // Sections: their lengths are known now, so their offsets are; the header goes last.
    let mut sections = vec![Section {
        kind: SectionKind::Dense,
        offset: 0,
        length: dense.len() as u64,
        checksum: leanstream::model::flash::checksum(&dense),
    }];
    for (l, geo) in geometry.iter().enumerate() {
        sections.push(Section {
            kind: SectionKind::Ffn(l as u32),
            offset: 0,
            length: geo.blocks as u64 * geo.block_bytes as u64,
            checksum: 0,
        });
        let raw: Vec<u8> = placement.layers[l]
            .iter()
            .flat_map(|n| n.to_le_bytes())
            .collect();
        sections.push(Section {
            kind: SectionKind::Placement(l as u32),
            offset: 0,
            length: raw.len() as u64,
            checksum: leanstream::model::flash::checksum(&raw),
        });
    }
    if let Some(t) = &thresholds {
        sections.push(Section {
            kind: SectionKind::Thresholds,
            offset: 0,
            length: t.len() as u64,
            checksum: leanstream::model::flash::checksum(t),
        });
    }
    if let Some(fq) = &frequency {
        sections.push(Section {
            kind: SectionKind::Frequency,
            offset: 0,
            length: fq.len() as u64,
            checksum: leanstream::model::flash::checksum(fq),
        });
    }
    let mut header = Header {
        model_identity: model_identity(g),
        model_name: g
            .get_str("general.name")
            .map(str::to_string)
            .unwrap_or_else(|| {
                model
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into()
            }),
        tables_identity: leanstream::tables::model_identity(&file),
        board: o.board.name.clone(),
        precision: precision.name().into(),
        placement: o.placement.name().into(),
        read_unit: o.board.read_unit as u32,
        layers: geometry.clone(),
        sections,
    };
    // The header's length depends on the offsets (postcard varints): lay out until it stays.
    let mut start = PAGE as u64;
    loop {
        let mut at = start;
        for s in header.sections.iter_mut() {
            s.offset = at;
            at = (at + s.length).next_multiple_of(PAGE as u64);
        }
        let need = (encode_header(&header).len() as u64).next_multiple_of(PAGE as u64);
        if need <= start {
            break;
        }
        start = need;
    }
    let file_bytes = header
        .sections
        .iter()
        .map(|s| s.offset + s.length)
        .max()
        .unwrap_or(start);

    let partial = partial_path(out);
    let written = write_sections(
        &partial,
        &mut header,
        &dense,
        &placement,
        thresholds.as_deref(),
        frequency.as_deref(),
        file_bytes,
        &layer_ffn,
        &mut scratch,
        progress,
    )
    .and_then(|_| {
        // It must open, and check whole, before it replaces anything.
        leanstream::model::flash::FlashImage::open(&partial)
            .and_then(|img| img.verify())
            .map_err(|e| {
                format!(
                    "flash wrote an image that does not read back: {}: {e}",
                    partial.display()
                )
            })
    })
    .and_then(|_| std::fs::rename(&partial, out).map_err(|e| format!("{}: {e}", out.display())));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    Ok(FlashReport {
        ffn_bytes: header
            .sections
            .iter()
            .filter(|s| matches!(s.kind, SectionKind::Ffn(_)))
            .map(|s| s.length)
            .sum(),
        header,
        file_bytes,
        dense_bytes: dense.len() as u64,
        dense_arena,
        min_cache,
        costs,
    })
}

/// A layer's gate, up and down matrices in the image's precision: type, bytes, the source.
type LayerParts<'f> = [(GgmlType, Cow<'f, [u8]>, TensorRef<'f>); 3];
type LayerFfn<'f> = dyn Fn(usize, &mut Vec<f32>) -> Result<LayerParts<'f>, String> + 'f;

/// Writes every section at its offset and the header at 0 (with the FFN checksums, known only
/// once the blocks are made).
#[allow(clippy::too_many_arguments)]
fn write_sections<'f>(
    path: &Path,
    header: &mut Header,
    dense: &[u8],
    placement: &Placement,
    thresholds: Option<&[u8]>,
    frequency: Option<&[u8]>,
    file_bytes: u64,
    layer_ffn: &LayerFfn<'f>,
    scratch: &mut Vec<f32>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), String> {
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.set_len(file_bytes).map_err(io)?;
    let at = |kind: SectionKind, h: &Header| {
        h.sections
            .iter()
            .find(|s| s.kind == kind)
            .map(|s| s.offset)
            .expect("every section is in the table")
    };
    let mut put = |offset: u64, bytes: &[u8]| -> Result<(), String> {
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        f.write_all(bytes).map_err(io)
    };
    put(at(SectionKind::Dense, header), dense)?;
    if let Some(t) = thresholds {
        put(at(SectionKind::Thresholds, header), t)?;
    }
    if let Some(fq) = frequency {
        put(at(SectionKind::Frequency, header), fq)?;
    }
    let n_layers = header.layers.len();
    for l in 0..n_layers {
        let raw: Vec<u8> = placement.layers[l]
            .iter()
            .flat_map(|n| n.to_le_bytes())
            .collect();
        put(at(SectionKind::Placement(l as u32), header), &raw)?;

        // This layer's bundles, built as the engine builds them, then copied slot by slot.
        let [(gty, gate, gt), (uty, up, ut), (dty, down, dt)] = layer_ffn(l, scratch)?;
        let (g, u, d) = (
            TensorRef {
                ty: gty,
                cols: gt.cols,
                rows: gt.rows,
                data: &gate,
            },
            TensorRef {
                ty: uty,
                cols: ut.cols,
                rows: ut.rows,
                data: &up,
            },
            TensorRef {
                ty: dty,
                cols: dt.cols,
                rows: dt.rows,
                data: &down,
            },
        );
        let mut plan = Plan::default();
        Bundles::plan(&mut plan, &g, &u, &d, BUNDLE_DOWN).map_err(|e| format!("layer {l}: {e}"))?;
        let mut arena = Arena::map(ArenaKind::FfnCache, plan.bytes).map_err(|e| e.to_string())?;
        let mut carver = arena.carver();
        let bundles = Bundles::build(&mut carver, &g, &u, &d, BUNDLE_DOWN)
            .map_err(|e| format!("layer {l}: {e}"))?;
        let Down::Columns(cols) = bundles.down else {
            unreachable!("BundleDown::AtLeast8Bit keeps columns")
        };
        let geo = header.layers[l];
        let (gb, ub, db) = geo.part_bytes().expect("made above");
        let k = geo.per_block as usize;
        let mut block = vec![0u8; geo.block_bytes as usize];
        let mut sum = Checksum::default();
        let base = at(SectionKind::Ffn(l as u32), header);
        for (b, neurons) in placement.layers[l].chunks(k).enumerate() {
            block.fill(0);
            for (i, &n) in neurons.iter().enumerate() {
                let n = n as usize;
                block[i * gb..][..gb].copy_from_slice(bundles.gate.row(n));
                block[k * gb + i * ub..][..ub].copy_from_slice(bundles.up.row(n));
                block[k * (gb + ub) + i * db..][..db].copy_from_slice(cols.row(n));
            }
            sum.write(&block);
            put(base + (b * block.len()) as u64, &block)?;
        }
        header
            .sections
            .iter_mut()
            .find(|s| s.kind == SectionKind::Ffn(l as u32))
            .expect("in the table")
            .checksum = sum.finish();
        progress(l as u64 + 1, n_layers as u64);
    }
    put(0, &encode_header(header))?;
    f.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boards_load_and_refuse_naming_the_field() {
        let host = BoardTarget::load("host").unwrap();
        assert_eq!((host.name.as_str(), host.read_unit), ("host", 4096));
        assert_eq!(host.dense_weights, 1536 << 20);
        let e = BoardTarget::load("nope").unwrap_err();
        assert!(
            e.contains("no board-configs/nope.toml") && e.contains("host"),
            "{e}"
        );
        let small = BoardTarget {
            name: "tiny".into(),
            dense_weights: 1 << 20,
            ffn_cache: 1 << 20,
            read_unit: 4096,
            merge_blocks: 16,
        };
        check_board(&small, 1 << 20, 1 << 20).unwrap();
        let e = check_board(&small, 2 << 20, 0).unwrap_err();
        assert!(
            e.contains("[budget] dense_weights is 1.0 MiB, the dense part needs 2.0 MiB"),
            "{e}"
        );
        let e = check_board(&small, 0, 3 << 20).unwrap_err();
        assert!(
            e.contains("[budget] ffn_cache") && e.contains("3.0 MiB"),
            "{e}"
        );
    }
}
