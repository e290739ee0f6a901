//! `leanstream calibrate-kv`: the int8 KV layout cost model fitted on this machine
//! (`leanstream_tools::offline::calibrate_kv`).

use super::*;

#[derive(Args)]
pub struct CalibrateKvArgs {
    /// The model the table is for (its KV shape is benchmarked; the table carries its identity).
    #[arg(long)]
    model: PathBuf,
    /// Where to write the table (default: tables/kvcost-<model file stem>.bin).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn cmd_calibrate_kv(a: CalibrateKvArgs) -> Result<(), String> {
    use leanstream::kv::{self, Layout, Shape};
    let file = ModelFile::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let h = file
        .hyper()
        .map_err(|e| format!("{}: {e}", a.model.display()))?;
    if h.head_dim % 32 != 0 || h.head_dim > kv::MAX_HEAD_DIM {
        return Err(format!(
            "head_dim {} has no int8 KV cache (needs a multiple of 32, at most {})",
            h.head_dim,
            kv::MAX_HEAD_DIM
        ));
    }
    let shape = Shape {
        n_layers: h.n_layers,
        kv_heads: h.n_kv_heads,
        head_dim: h.head_dim,
        context: 4096,
    };
    let (model, points) =
        leanstream_tools::offline::calibrate_kv::calibrate(shape, &[64, 256, 1024, 4096]);
    println!("bandwidth: {:.2} GB/s", model.bandwidth / 1e9);
    println!(
        "| layout | tokens | measured us | model us | bytes | ops |\n|---|---|---|---|---|---|"
    );
    let one = Shape {
        n_layers: 1,
        ..shape
    };
    for p in &points {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.0} |",
            p.layout.name(),
            p.tokens,
            p.seconds * 1e6,
            model.cost(p.layout, &one, p.tokens) * 1e6,
            p.bytes,
            p.ops
        );
    }
    println!(
        "alpha1 = {:.4}, alpha2 = {:.3e} s/op; margin {}, persist {} tokens",
        model.alpha1, model.alpha2, model.margin, model.persist
    );
    let choice: Vec<String> = [1, 64, 256, 512, 1024, 4096]
        .iter()
        .map(|&t| {
            let b = model.best(&one, t);
            let gain = 1.0 - model.cost(b, &one, t) / model.cost(Layout::TokenMajor, &one, t);
            format!("{t}: {} ({:.1}% under token-major)", b.name(), gain * 100.0)
        })
        .collect();
    println!("best layout by length: {}", choice.join(", "));
    let out = a.out.unwrap_or_else(|| {
        let stem = a
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        PathBuf::from(format!("tables/kvcost-{stem}.bin"))
    });
    let id = leanstream::tables::model_identity(&file);
    leanstream::tables::write(&out, kv::TABLE_KIND, kv::TABLE_VERSION, id, &model)
        .map_err(|e| e.to_string())?;
    println!("wrote {}", out.display());
    Ok(())
}
