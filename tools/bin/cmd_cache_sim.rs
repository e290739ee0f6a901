//! `leanstream cache-sim`: the weight cache's policies and Belady's floor on a trace's
//! activations (`leanstream_tools::offline::cache_sim`).

use super::*;
use leanstream::predict::reuse::ReuseTable;
use leanstream_tools::offline::cache_sim::{miss_ratios, HOT_SHARE};
use leanstream_tools::offline::placement::{Active, ActiveSets};
use leanstream_tools::offline::trace::TraceReader;

#[derive(Args)]
pub struct CacheSimArgs {
    /// The activation trace (`leanstream trace`) whose tokens are fed to the caches.
    #[arg(long)]
    trace: PathBuf,
    /// A trace of other text the hot policy profiles its pinned neurons on (default: the same).
    #[arg(long, value_name = "TRACE")]
    profile_trace: Option<PathBuf>,
    /// Neurons active per token: all but this fraction, by |SiLU(gate) * up| per layer.
    #[arg(long, value_name = "S", default_value_t = 0.8)]
    sparsity: f32,
    /// Cache budgets, comma-separated fractions of each layer's neurons.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.25,0.5")]
    budgets: Vec<f64>,
    /// A reuse-distance table (leanstream train-eviction --stream per-layer): adds the learned
    /// policy.
    #[arg(long, value_name = "FILE")]
    eviction: Option<PathBuf>,
}

pub fn cmd_cache_sim(a: CacheSimArgs) -> Result<(), String> {
    if !(0.0..1.0).contains(&a.sparsity) {
        return Err(format!("--sparsity {} is not in [0, 1)", a.sparsity));
    }
    let rule = Active::TopK {
        keep: 1.0 - a.sparsity,
    };
    let trace = TraceReader::open(&a.trace)?;
    let learned = match &a.eviction {
        Some(p) => {
            let id = trace
                .meta("identity")
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or("the trace names no model identity")?;
            let t =
                ReuseTable::read(p, id).map_err(|e| format!("--eviction {}: {e}", p.display()))?;
            Some(std::sync::Arc::new(t))
        }
        None => None,
    };
    let active = ActiveSets::from_trace(&trace, &rule)?;
    let profile = match &a.profile_trace {
        Some(p) => ActiveSets::from_trace(&TraceReader::open(p)?, &rule)?,
        None => active.clone(),
    };
    if profile.neurons != active.neurons || profile.sets.len() != active.sets.len() {
        return Err("the profile trace is of another model shape".into());
    }
    let rows = miss_ratios(&active, &profile, &a.budgets, learned.as_ref())?;
    println!(
        "{} tokens, {} layers of {} neurons, sparsity {} (top {:.0}% per token and layer), per-neuron cache per layer; hot pins {:.0}% of it",
        active.tokens(),
        active.sets.len(),
        active.neurons,
        a.sparsity,
        100.0 * (1.0 - a.sparsity),
        100.0 * HOT_SHARE
    );
    println!(
        "| budget | lru | lfu | hot |{} Belady (floor) |\n|---|---|---|---|{}---|",
        if learned.is_some() { " learned |" } else { "" },
        if learned.is_some() { "---|" } else { "" }
    );
    for r in rows {
        println!(
            "| {:.0}% | {:.3} | {:.3} | {:.3} |{} {:.3} |",
            100.0 * r.budget,
            r.policies[0],
            r.policies[1],
            r.policies[2],
            r.learned.map(|v| format!(" {v:.3} |")).unwrap_or_default(),
            r.belady
        );
    }
    Ok(())
}
